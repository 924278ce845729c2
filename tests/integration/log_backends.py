"""The two implementations of `streams.log.Log` the contract runs against, and its events.

`backend` is a memory log or a real nats-server (fresh streams each case), with a second client
and the server-side faults the cases need. The cases: test_log_contract*.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import pytest_asyncio
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from core.events import (
    EndpointLoad,
    EndpointStatus,
    Heartbeat,
    HeartbeatData,
    LeaderChanged,
    LeaderChangedData,
    Role,
    StartCommand,
    StartCommandData,
)
from core.ids import derive_id, new_id
from streams.connection import connect
from streams.definitions import MOTOR_STREAM, ensure_streams
from streams.jetstream import JetStreamLog
from streams.log import Log, Range
from streams.memory import MemoryLog, MemoryServer
from streams.server import EmbeddedNats

LEASE_TTL = 1.0


@dataclass
class Backend:
    """One implementation under test: its first client, more clients, and the server's faults."""

    name: str
    log: Log
    more: Callable[[], Awaitable[Log]]
    recreate: Callable[[str], Awaitable[None]]
    advance: Callable[[float], Awaitable[None]]  # let the server's clock move on
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


@pytest_asyncio.fixture(loop_scope="session", params=["jetstream", "memory"])
async def backend(request: pytest.FixtureRequest, nats_server: EmbeddedNats) -> AsyncIterator[Backend]:
    if request.param == "memory":
        offset = [0.0]
        server = MemoryServer(clock=lambda: time.time() + offset[0])
        server.ensure_streams(lease_ttl=LEASE_TTL)

        async def more() -> Log:
            return MemoryLog(server)

        async def recreate(stream: str) -> None:
            server.recreate(stream)

        async def advance(seconds: float) -> None:
            offset[0] += seconds
            await asyncio.sleep(0)

        yield Backend("memory", MemoryLog(server), more, recreate, advance)
        return
    nc = await connect(nats_server.url, name="pytest-contract")
    js = nc.jetstream()
    await _fresh(js)
    b = Backend(
        "jetstream",
        JetStreamLog(nc),
        lambda: _client(b, nats_server.url),
        lambda s: _recreate(js, s),
        asyncio.sleep,
    )
    try:
        yield b
    finally:
        for close in b.closers:
            with contextlib.suppress(Exception):
                await close()
        await nc.close()


async def _fresh(js: JetStreamContext) -> None:
    from tests.conftest import ALL_STREAMS

    for name in ALL_STREAMS:
        with contextlib.suppress(NotFoundError):
            await js.delete_stream(name)
    await ensure_streams(js, lease_ttl=LEASE_TTL)


async def _client(b: Backend, url: str) -> Log:
    nc = await connect(url, name="pytest-contract-more")
    b.closers.append(nc.close)
    return JetStreamLog(nc)


async def _recreate(js: JetStreamContext, stream: str) -> None:
    await js.delete_stream(stream)
    await ensure_streams(js, lease_ttl=LEASE_TTL)


def leader(term: int, who: str = "c1") -> LeaderChanged:
    return LeaderChanged(
        id=derive_id("contract-leader", who, term),
        ts=1_700_000_000.0 + term,
        source=f"controller/{who}",
        data=LeaderChangedData(leader_id=who, term=term),
    )


def start_command(node: str) -> StartCommand:
    data = StartCommandData(
        command_id=new_id(), node_id=node, instance_id=7, job_name="motor", role=Role.UNION,
        engine_type="builtin", model="m", endpoints=(), master_dp_ip="127.0.0.1",
    )  # fmt: skip
    return StartCommand(id=new_id(), ts=time.time(), source="test/controller", data=data)


def beat(node: str, i: int) -> Heartbeat:
    data = HeartbeatData(
        node_id=node, endpoints=(EndpointLoad(id=0, status=EndpointStatus.READY, running=i),)
    )
    return Heartbeat(
        id=derive_id("contract-hb", node, i), ts=1_700_000_000.0 + i, source=f"nodeagent/{node}", data=data
    )


async def read_all(
    log: Log, stream: str = MOTOR_STREAM, span: Range = Range()
) -> list[tuple[int, str, bytes]]:
    return [(d.seq, d.subject, d.data) async for batch in log.read(stream, span) for d in batch]
