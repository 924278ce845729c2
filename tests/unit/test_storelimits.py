"""How much disk the log may take (core/storelimits.py), and how a full store's refusal reads
(streams/publisher.py): the limits sit below the disk, and a refusal names the limit."""

from __future__ import annotations

import pytest
from nats.js.errors import APIError

from core.config import NatsConfig
from core.errors import ConfigError
from core.storelimits import DEFAULT_MAX_BYTES, GiB, MiB, plan_store, store_cap
from streams.definitions import MOTOR_STREAM, stream_configs
from streams.errors import PublishFailed, SequenceConflict, StoreFull
from streams.publisher import _api_error


@pytest.mark.parametrize(
    ("configured", "free", "used", "max_bytes", "max_file_store"),
    [
        # a big disk: the default, its headroom an eighth and MOTOR_REQ's share another
        (None, 100 * GiB, 0, DEFAULT_MAX_BYTES, DEFAULT_MAX_BYTES + GiB // 4),
        (None, 24 * MiB, 0, 12 * MiB, 17 * MiB + MiB // 2),  # a small disk: what fits in 75% of it
        (None, 12 * MiB, 12 * MiB, 12 * MiB, 17 * MiB + MiB // 2),  # what the store holds counts as room
        (4 * MiB, 24 * MiB, 0, 4 * MiB, 9 * MiB),  # configured and fits: headroom 4 MiB, MOTOR_REQ 1 MiB
        (64 * MiB, 1 * GiB, 0, 64 * MiB, 80 * MiB),  # each an eighth beyond 32 MiB
        (
            8 * MiB,
            9 * MiB,
            9 * MiB,
            8 * MiB,
            13 * MiB,
        ),  # a restart on a store that holds its share: fits again
    ],
)
def test_the_log_is_fit_into_three_quarters_of_its_disk(
    configured: int | None, free: int, used: int, max_bytes: int, max_file_store: int
) -> None:
    got = plan_store(configured, free=free, used=used)
    assert (got.max_bytes, got.max_file_store) == (max_bytes, max_file_store)
    assert got.max_file_store == store_cap(got.max_bytes) <= 0.75 * (free + used)


@pytest.mark.parametrize(
    ("configured", "free", "said"),
    [
        (16 * MiB, 24 * MiB, "nats.max_bytes 16.0 MiB needs 22.0 MiB of store under /s"),
        (None, 4 * MiB, "too little for the log; free disk space"),
    ],
)
def test_a_disk_too_small_for_the_log_is_refused_naming_the_sizes(
    configured: int | None, free: int, said: str
) -> None:
    with pytest.raises(ConfigError, match="free disk space") as err:
        plan_store(configured, free=free, used=0, where="/s")
    assert said in str(err.value)


def test_motor_refuses_new_events_at_max_bytes_rather_than_dropping_old_ones() -> None:
    motor = next(c for c in stream_configs(NatsConfig(max_bytes=8 * MiB)) if c.name == MOTOR_STREAM)
    assert motor.max_bytes == 8 * MiB and motor.discard is not None and motor.discard.value == "new"
    default = next(c for c in stream_configs(NatsConfig()) if c.name == MOTOR_STREAM)
    assert default.max_bytes == DEFAULT_MAX_BYTES
    with pytest.raises(ValueError):
        NatsConfig(max_bytes=1000)


@pytest.mark.parametrize(
    ("code", "description", "kind", "said"),
    [
        (
            10077,
            "maximum bytes exceeded",
            StoreFull,
            "MOTOR is at its nats.max_bytes (maximum bytes exceeded)",
        ),
        (10023, "insufficient resources", StoreFull, "JetStream store is full (its max_file_store)"),
        (10047, "insufficient storage resources available", StoreFull, "storage of the server or account"),
        (10071, "wrong last sequence: 3", SequenceConflict, "expected last subject sequence 2"),
        (10060, "expected stream does not match", PublishFailed, "expected stream does not match"),
    ],
)
def test_a_refusal_names_its_cause(code: int, description: str, kind: type, said: str) -> None:
    err = _api_error(APIError(code=503, err_code=code, description=description), "motor.evt.node.n1", 2)
    assert type(err) is kind
    assert said in str(err)
    if kind is StoreFull:
        assert "send them again" in str(err) and "raising nats.max_bytes" in str(err)


def test_the_request_records_have_their_own_share_of_the_store() -> None:
    from core.requestlog import REQ_STREAM
    from core.storelimits import request_log_bytes

    cfgs = {c.name: c for c in stream_configs(NatsConfig(max_bytes=64 * MiB))}
    req, motor = cfgs[REQ_STREAM], cfgs[MOTOR_STREAM]
    assert req.max_bytes == request_log_bytes(64 * MiB) == 8 * MiB
    assert req.discard is not None and req.discard.value == "old"  # traffic history: the oldest go
    assert motor.max_bytes is not None and req.max_bytes is not None
    assert motor.max_bytes + req.max_bytes < store_cap(64 * MiB)  # beside MOTOR, never in its room
