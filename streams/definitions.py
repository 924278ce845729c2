"""Streams and KV buckets as data, and `ensure_streams` to apply them (safe on every start).

| stream            | subjects                   | why                                            |
|-------------------|----------------------------|------------------------------------------------|
| MOTOR             | motor.evt.>, motor.cmd.>   | the log: one total order of events and commands |
| MOTOR_HB          | motor.hb.>                 | heartbeats, latest per node survives           |
| MOTOR_REQ         | motor.req.>                | per-request routing records (7 days, ⅛ of MOTOR) |
| KV_motor_leader   | $KV.motor_leader.>         | the controller lease (TTL)                     |
| KV_motor_checkpoints | $KV.motor_checkpoints.> | controller state at a stream sequence          |
| KV_motor_kvview   | $KV.motor_kvview.>         | each endpoint's cached KV blocks (kv_aware)    |
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import APIError, NotFoundError

from core import subjects
from core.ageout import DAY as DAY  # re-exported: tests and tools count days with it
from core.ageout import max_age_seconds
from core.config import ControllerConfig, NatsConfig
from core.requestlog import ALL_REQUESTS, REQ_STREAM
from core.storelimits import DEFAULT_MAX_BYTES, request_log_bytes
from streams.errors import StreamsError

log = logging.getLogger(__name__)

MOTOR_STREAM = "MOTOR"
HB_STREAM = "MOTOR_HB"
# Request records: traffic history, not lifecycle facts, bounded on their own (oldest go first).
REQ_MAX_AGE = 7 * 86400.0
LEADER_BUCKET = "motor_leader"
CHECKPOINT_BUCKET = "motor_checkpoints"
# Key `<node>.<endpoint>` (core.subjects.kv_view_key): the blocks that engine holds now, as
# its node agent compacted them (nodeagent.kvwatch); the latest value is all a reader needs.
KVVIEW_BUCKET = "motor_kvview"

DEDUPE_WINDOW = 120.0  # a retried publish within 2 minutes is dropped by Nats-Msg-Id
HB_MAX_AGE = 3600.0
CHECKPOINT_HISTORY = 4  # a few older checkpoints survive a bad write
CHECKPOINT_MAX_VALUE = 8 * 1024 * 1024
LEASE_TTL: float = ControllerConfig.model_fields["lease_ttl"].default
# MOTOR holds one durable command consumer per node agent, besides every fold's ordered one.
# A stream that sets no limit gets nats-server's `default_max_consumers` (1000 since 2.15):
# the agent of about the 1000th node could not bind its consumer and never came up.
MOTOR_MAX_CONSUMERS = 1_000_000
# A request NATS permissions forbid gets no answer at all (the client logs the violation).
NO_ANSWER = (
    "no answer (only a NATS user with JetStream admin rights may create or change streams: "
    "`motor up` makes them as `admin` before it starts anything)"
)


def motor_max_bytes(cfg: NatsConfig) -> int:
    """MOTOR's `max_bytes`: the config's, else the default (`core.storelimits`)."""
    return cfg.max_bytes if cfg.max_bytes is not None else DEFAULT_MAX_BYTES


INSUFFICIENT_STORAGE = 10047  # JetStream: the stream's max_bytes does not fit the server's store
TOO_BIG = "MOTOR's nats.max_bytes is more than the server's JetStream store may hold: lower it"


def kv_stream(bucket: str) -> str:
    """The stream behind a KV bucket."""
    return f"KV_{bucket}"


def _kv_config(
    bucket: str, *, history: int, ttl: float | None, replicas: int, description: str
) -> StreamConfig:
    # The same shape nats-py's create_key_value builds, so `js.key_value(bucket)` works on it.
    return StreamConfig(
        name=kv_stream(bucket),
        description=description,
        subjects=[f"$KV.{bucket}.>"],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        allow_direct=True,
        allow_rollup_hdrs=True,
        deny_delete=True,
        discard=DiscardPolicy.NEW,
        duplicate_window=min(DEDUPE_WINDOW, ttl) if ttl else DEDUPE_WINDOW,
        max_age=ttl or 0.0,
        max_msgs_per_subject=history,
        num_replicas=replicas,
    )


def stream_configs(cfg: NatsConfig | None = None, *, lease_ttl: float = LEASE_TTL) -> list[StreamConfig]:
    """Every stream Motor needs (the two KV buckets included), from the config's nats section."""
    cfg = cfg or NatsConfig()
    replicas = cfg.replicas
    return [
        StreamConfig(
            name=MOTOR_STREAM,
            description="Motor lifecycle events and commands",
            subjects=[subjects.ALL_EVENTS, subjects.ALL_COMMANDS],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            # Full at max_bytes: the next publish is refused, naming the limit (streams.errors.
            # StoreFull); no acknowledged event is ever dropped to make room (core.storelimits).
            discard=DiscardPolicy.NEW,
            max_bytes=motor_max_bytes(cfg),
            max_age=max_age_seconds(cfg),
            # JetStream refuses a window longer than max_age (a log of minutes, for one).
            duplicate_window=min(DEDUPE_WINDOW, max_age_seconds(cfg)),
            num_replicas=replicas,
            allow_direct=True,
            # Decisions land as atomic batches, all or nothing (streams.batch).
            allow_atomic=True,
            max_consumers=MOTOR_MAX_CONSUMERS,
        ),
        StreamConfig(
            name=HB_STREAM,
            description="Motor heartbeats, latest per node",
            subjects=[subjects.ALL_HEARTBEATS],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            max_age=HB_MAX_AGE,
            max_msgs_per_subject=1,
            duplicate_window=10.0,
            num_replicas=replicas,
            allow_direct=True,
        ),
        StreamConfig(
            name=REQ_STREAM,
            description="Motor coordinators' per-request routing records (motor replay --request)",
            subjects=[ALL_REQUESTS],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            discard=DiscardPolicy.OLD,
            max_age=REQ_MAX_AGE,
            max_bytes=request_log_bytes(motor_max_bytes(cfg)),
            duplicate_window=60.0,
            num_replicas=replicas,
            allow_direct=True,
        ),
        _kv_config(
            LEADER_BUCKET,
            history=1,
            ttl=lease_ttl,
            replicas=replicas,
            description="Motor controller leader lease",
        ),
        _kv_config(
            CHECKPOINT_BUCKET,
            history=CHECKPOINT_HISTORY,
            ttl=None,
            replicas=replicas,
            description="Motor controller state checkpoints",
        ),
        _kv_config(
            KVVIEW_BUCKET,
            history=1,
            ttl=None,
            replicas=replicas,
            description="Motor KV cache views: the blocks each engine holds",
        ),
    ]


def _differs(want: StreamConfig, have: StreamConfig) -> dict[str, tuple[Any, Any]]:
    """Fields we set whose value on the server is different."""
    want_d = want.as_dict()
    have_d = have.as_dict()
    diff: dict[str, tuple[Any, Any]] = {}
    for key, value in want_d.items():
        if value is None or key == "name":
            continue
        current = have_d.get(key)
        if key == "subjects":
            if sorted(value) != sorted(current or []):  # type: ignore[call-overload]
                diff[key] = (current, value)
        elif current != value:
            diff[key] = (current, value)
    return diff


async def ensure_streams(
    js: JetStreamContext, cfg: NatsConfig | None = None, *, lease_ttl: float = LEASE_TTL, update: bool = True
) -> None:
    """Create the streams and KV buckets, or update the ones whose settings changed.

    `update=False` only creates what is missing (tools that must not reset an operator's
    settings to the defaults, e.g. `motor events import`).
    """
    for want in stream_configs(cfg, lease_ttl=lease_ttl):
        assert want.name is not None
        try:
            info = await js.stream_info(want.name)
        except NotFoundError:
            try:
                await js.add_stream(want)
            except APIError as exc:
                hint = f" ({TOO_BIG})" if exc.err_code == INSUFFICIENT_STORAGE else ""
                raise StreamsError(
                    f"cannot create stream {want.name}: {exc.description or exc}{hint}"
                ) from None
            except NatsTimeoutError:
                raise StreamsError(f"cannot create stream {want.name}: {NO_ANSWER}") from None
            log.info("created stream %s", want.name)
            continue
        diff = _differs(want, info.config)
        if not diff or not update:
            continue
        # Keep what the operator set that we do not manage (placement, metadata, ...).
        merged = dataclasses.replace(
            info.config, **{k: v for k, v in dataclasses.asdict(want).items() if v is not None}
        )
        try:
            await js.update_stream(merged)
        except NatsTimeoutError:
            raise StreamsError(f"cannot update stream {want.name}: {NO_ANSWER}") from None
        except APIError as exc:
            if exc.err_code == INSUFFICIENT_STORAGE:
                raise StreamsError(
                    f"cannot update stream {want.name}: {exc.description} ({TOO_BIG})"
                ) from None
            fields = ", ".join(sorted(diff))
            raise StreamsError(
                f"stream {want.name}: cannot change {fields} in place ({exc.description or exc}); "
                "back up with `motor events export`, delete the stream and start again"
            ) from None
        log.info(
            "updated stream %s: %s", want.name, ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in diff.items())
        )
