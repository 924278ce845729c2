"""A node agent whose NATS goes away (killed and restarted on its store, or frozen) keeps serving.

Each test runs its own nats-server (the session one is shared). The agent as a real subprocess
with a real builtin engine must outlive the outage with the same engine process, heartbeat
again once NATS is back, and still take commands. Its parts in process: an ack that times out
does not end the command consumer, heartbeats are dropped (not buffered) while NATS is away,
and an event the server keeps refusing is dropped so the ones after it still land.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from nats.aio.client import Client

from core import subjects
from core.codec import decode
from core.config import ClusterConfig, EngineSection, NodeAgentConfig
from core.events import (
    EndpointSpec,
    EndpointStatus,
    EndpointStatusChanged,
    EndpointStatusChangedData,
    Heartbeat,
    NodeRegistered,
    Role,
)
from core.ids import new_id
from nodeagent.commands import Command, CommandConsumer
from nodeagent.engines import Engines
from nodeagent.errors import Refusal
from nodeagent.heartbeat import Heartbeats
from nodeagent.host import ProcessHost
from nodeagent.metrics import AgentMetrics
from nodeagent.outbox import Outbox
from nodeagent.settings import AgentSettings
from streams.connection import connect
from streams.definitions import MOTOR_STREAM, ensure_streams
from streams.errors import PublishFailed, StreamsError
from streams.jetstream import JetStreamLog
from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.integration.nodeagent_harness import (
    Agent,
    EventTail,
    pid_alive,
    start_command,
    stop_command,
    write_config,
)

pytestmark = pytest.mark.timeout(240)

OUTAGE = 15.0


class OwnNats:
    """A nats-server of one test, restartable on the same store and port."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.server = EmbeddedNats(base / "data", log_file=base / "nats.log")

    @property
    def url(self) -> str:
        return self.server.url

    async def start(self) -> None:
        await self.server.start()

    async def kill9(self) -> None:
        pid = self.server.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        await self.server.stop()  # reaps it

    async def restart(self) -> None:
        self.server = EmbeddedNats(self.base / "data", port=self.server.port, log_file=self.base / "nats.log")
        await self.server.start()

    def freeze(self, on: bool) -> None:
        pid = self.server.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP if on else signal.SIGCONT)


@pytest_asyncio.fixture(loop_scope="session")
async def own_nats(tmp_path: Path) -> AsyncIterator[OwnNats]:
    n = OwnNats(tmp_path / "nats")
    await n.start()
    try:
        yield n
    finally:
        with contextlib.suppress(Exception):
            n.freeze(False)
        await n.server.stop()


async def client(n: OwnNats) -> Client:
    nc = await connect(n.url, name="pytest-own", retry_initial=True)
    await ensure_streams(nc.jetstream())
    return nc


def status_is(node: str, status: EndpointStatus):  # type: ignore[no-untyped-def]
    return lambda ev: (
        isinstance(ev, EndpointStatusChanged) and ev.data.node_id == node and ev.data.status == status
    )


async def serving_agent(
    tmp_path: Path, n: OwnNats, nc: Client, agents: list[Agent]
) -> tuple[Agent, int, EventTail]:
    """An agent with one READY builtin engine; returns it, the engine pid and a tail."""
    node = f"n-{new_id()[-10:]}"
    cfg = write_config(tmp_path / "cluster.json")
    agent = Agent(tmp_path, cfg, node, n.url).start()
    agents.append(agent)
    tail = await EventTail(nc).start()
    reg = await tail.wait(lambda ev: isinstance(ev, NodeRegistered) and ev.data.node_id == node, within=60)
    await Publisher(nc.jetstream()).publish(start_command(node, reg.data.endpoints))
    await tail.wait(status_is(node, EndpointStatus.READY), within=60)
    pid = int((await agent.status())["endpoints"][0]["pid"])
    return agent, pid, tail


async def fresh_heartbeat(nc: Client, node: str, since: float, within: float = 20.0) -> Heartbeat:
    """The first heartbeat of `node` stamped after `since` (wall clock)."""
    got: asyncio.Queue[Heartbeat] = asyncio.Queue()

    async def on(msg: object) -> None:
        ev = decode(msg.data)  # type: ignore[attr-defined]
        assert isinstance(ev, Heartbeat)
        got.put_nowait(ev)

    sub = await nc.subscribe(subjects.heartbeat(node), cb=on)
    try:
        async with asyncio.timeout(within):
            while True:
                hb = await got.get()
                if hb.ts > since:
                    return hb
    finally:
        await sub.unsubscribe()


async def still_serving(agent: Agent, pid: int) -> None:
    assert agent.proc is not None and agent.proc.poll() is None, agent.output()[-3000:]
    assert pid_alive(pid)
    st = await agent.status()
    (ep,) = st["endpoints"]
    assert ep["pid"] == pid and ep["live"] and ep["status"] == "READY", st


async def takes_commands(nc: Client, tail: EventTail, agent: Agent) -> None:
    """A stop published after the outage is carried out (the command consumer survived it)."""
    mark = tail.index()
    await Publisher(nc.jetstream()).publish(stop_command(agent.node_id))
    await tail.wait(status_is(agent.node_id, EndpointStatus.STOPPED), after=mark, within=30)


async def test_nats_killed_for_15s_engines_keep_serving_and_heartbeats_resume(
    tmp_path: Path, own_nats: OwnNats, agents: list[Agent]
) -> None:
    nc = await client(own_nats)
    agent, pid, tail = await serving_agent(tmp_path, own_nats, nc, agents)
    await tail.close()
    await nc.close()

    await own_nats.kill9()
    await asyncio.sleep(OUTAGE)  # the outage itself: nothing to await
    await still_serving(agent, pid)
    await own_nats.restart()
    back = time.time()

    nc = await client(own_nats)
    try:
        await fresh_heartbeat(nc, agent.node_id, back)
        await still_serving(agent, pid)
        tail = await EventTail(nc).start()
        try:
            await takes_commands(nc, tail, agent)
        finally:
            await tail.close()
    finally:
        await nc.close()


async def test_nats_frozen_for_15s_engines_keep_serving_and_heartbeats_resume(
    tmp_path: Path, own_nats: OwnNats, agents: list[Agent]
) -> None:
    nc = await client(own_nats)
    agent, pid, tail = await serving_agent(tmp_path, own_nats, nc, agents)
    await tail.close()
    await nc.close()

    own_nats.freeze(True)
    try:
        await asyncio.sleep(OUTAGE)  # the outage itself: nothing to await
        await still_serving(agent, pid)
    finally:
        own_nats.freeze(False)
    back = time.time()

    nc = await client(own_nats)
    try:
        await fresh_heartbeat(nc, agent.node_id, back)
        await still_serving(agent, pid)
        tail = await EventTail(nc).start()
        try:
            await takes_commands(nc, tail, agent)
        finally:
            await tail.close()
    finally:
        await nc.close()


# --------------------------------------------------------------------------- parts in process

EPS = (EndpointSpec(id=0, ip="127.0.0.1", business_port=1, mgmt_port=1),)


async def test_an_ack_that_times_out_does_not_end_the_command_consumer(own_nats: OwnNats) -> None:
    nc = await client(own_nats)
    handled: list[str] = []

    async def handle(ev: Command, seq: int) -> None:
        handled.append(ev.data.command_id)
        if len(handled) == 1:
            own_nats.freeze(True)  # NATS stops answering between the result and the ack
            asyncio.get_running_loop().call_later(4.0, own_nats.freeze, False)

    async def refuse(ev: Command, refusal: Refusal) -> None:
        raise AssertionError(f"nothing is refused here: {refusal}")

    metrics = AgentMetrics("n1")
    consumer = CommandConsumer(JetStreamLog(nc), "n1", handle, refuse, metrics, ack_wait=30.0)
    await consumer.subscribe()
    run = asyncio.create_task(consumer.run())
    try:
        pub = Publisher(nc.jetstream())
        for cid in ("c1", "c2"):
            cmd = start_command("n1", EPS, command_id=cid)
            # As the controller does: a publish that got no ack (the freeze outlasted the
            # client's PINGs, so it reconnected) is sent again with the same id.
            async with asyncio.timeout(30):
                while True:
                    try:
                        await pub.publish(cmd)
                        break
                    except StreamsError:
                        await asyncio.sleep(0.2)
        async with asyncio.timeout(40):
            while handled != ["c1", "c2"]:
                assert not run.done(), run.exception()
                await asyncio.sleep(0.1)  # the handler list has no event to await
        assert not run.done()
        assert handled == ["c1", "c2"]  # the first one was acked, never delivered again
    finally:
        own_nats.freeze(False)
        consumer.stop()
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await consumer.close()
        await nc.close()


def _settings(tmp_path: Path) -> AgentSettings:
    cfg = ClusterConfig(nodeagent=NodeAgentConfig(heartbeat_interval=0.2), union=EngineSection())
    return AgentSettings(config=cfg, node_id="hb1", role=Role.UNION, ip="127.0.0.1", log_dir=tmp_path)


async def test_heartbeats_are_dropped_while_nats_is_away_and_the_first_after_is_fresh(
    tmp_path: Path, own_nats: OwnNats
) -> None:
    nc = await client(own_nats)
    settings = _settings(tmp_path)
    metrics = AgentMetrics("hb1")
    async with aiohttp.ClientSession() as session:
        host = ProcessHost(session)
        engines = Engines(settings, host, lambda c: None)
        beats = Heartbeats(settings, JetStreamLog(nc), host, engines, metrics, lambda: False)
        run = asyncio.create_task(beats.run())
        try:
            await fresh_heartbeat(nc, "hb1", time.time())
            await own_nats.kill9()
            await asyncio.sleep(3.0)  # the outage itself: nothing to await
            assert metrics.heartbeats_dropped.labels("hb1")._value.get() >= 5
            await own_nats.restart()
            back = time.time()
            watcher = await connect(own_nats.url, name="pytest-watch")
            got: list[Heartbeat] = []

            async def on(msg: object) -> None:
                ev = decode(msg.data)  # type: ignore[attr-defined]
                assert isinstance(ev, Heartbeat)
                got.append(ev)

            await watcher.subscribe(subjects.heartbeat("hb1"), cb=on)
            await fresh_heartbeat(watcher, "hb1", back)
            assert not run.done()
            # Nothing from the outage was buffered and sent late.
            assert [hb.ts for hb in got if hb.ts < back - 1.0] == []
            await watcher.close()
        finally:
            run.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await run
            await nc.close()


def _status_event(reason: str) -> EndpointStatusChanged:
    data = EndpointStatusChangedData(node_id="o1", endpoint_id=0, status=EndpointStatus.READY, reason=reason)
    return EndpointStatusChanged(id=new_id(), ts=time.time(), source="nodeagent/o1", data=data)


async def test_an_event_the_server_keeps_refusing_is_dropped_and_the_next_lands(own_nats: OwnNats) -> None:
    nc = await client(own_nats)
    js = nc.jetstream()
    metrics = AgentMetrics("o1")
    outbox = Outbox(Publisher(js), metrics, reject_budget=1.0)
    outbox.start()
    try:
        await js.delete_stream(MOTOR_STREAM)  # no stream takes the subject: refused
        refused = outbox.post(_status_event("refused"))
        with pytest.raises(PublishFailed):
            await asyncio.wait_for(refused, 20)
        assert metrics.events_dropped.labels("o1", "endpoint.status_changed")._value.get() == 1
        await ensure_streams(js)
        seq = await asyncio.wait_for(outbox.send(_status_event("lands")), 20)
        assert seq == 1
    finally:
        await outbox.close()
        await nc.close()
