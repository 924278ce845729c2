"""A checkpoint the controller cannot read (garbage, another format) is set aside and the whole
log replayed; NATS trouble while loading it is not mistaken for that (it is tried again). Told
apart by the error's type (`CorruptCheckpoint`), never by matching its message."""

from __future__ import annotations

import zlib
from collections.abc import Callable

import orjson
import pytest

from controller.service import ControllerService
from core.config import NatsConfig
from core.configfile import parse_config
from streams.definitions import CHECKPOINT_BUCKET
from streams.errors import StreamsError
from streams.memory import MemoryLog, MemoryServer
from streams.memory.link import DirectLink, T
from tests.unit.factories import registered

KEY = "motor"


def service() -> ControllerService:
    return ControllerService(parse_config("union: {instances: 1}"), controller_id="c1", checkpoint_key=KEY)


@pytest.mark.parametrize(
    "stored",
    [
        b"not zlib at all",
        zlib.compress(b"{not json"),
        zlib.compress(orjson.dumps({"format": 99, "state": {}})),
    ],
    ids=["garbage", "not json", "another format"],
)
async def test_an_unusable_checkpoint_is_set_aside_and_the_log_replayed(stored: bytes) -> None:
    server = MemoryServer()
    server.ensure_streams(NatsConfig())
    motor = MemoryLog(server)
    await motor.publisher().publish(registered("n1"))
    await motor.kv(CHECKPOINT_BUCKET).put(KEY, stored)
    svc = service()
    await svc._load_checkpoint(motor)  # no exception: the log is folded from its start instead
    assert svc.state.last_seq == 0


async def test_nats_trouble_while_loading_is_not_an_unusable_checkpoint() -> None:
    server = MemoryServer()
    server.ensure_streams(NatsConfig())
    motor = MemoryLog(server, Away())
    with pytest.raises(StreamsError, match="no answer"):
        await service()._load_checkpoint(motor)


class Away(DirectLink):
    """NATS away: no question gets an answer."""

    up = False

    async def call(self, op: Callable[[], T], within: float) -> T:
        raise TimeoutError
