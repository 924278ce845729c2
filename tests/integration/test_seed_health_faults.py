"""Seed 002's timed rules against real builtin engines with injected faults.

- health checks retry only timeouts (`health_collector_timeout_retry_attempts`); an HTTP error
  or a refused connection fails the check at once; connection failures inside
  `startup_timeout` keep an endpoint STARTING;
- the fault reporter runs when the engine config enables fault tolerance, at the section's
  `poll_interval`;
- a node whose engine stays ABNORMAL declares itself failed after N heartbeats, and clears
  that once its engines were stopped.
"""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import orjson
import pytest
from nats.js import JetStreamContext

from core.config import HealthCheckConfig
from core.events import (
    EndpointStatus,
    EndpointStatusChanged,
    FaultCleared,
    FaultLevel,
    FaultReported,
    NodeRegistered,
)
from core.ids import new_id
from nodeagent.health import HealthTracker, check
from streams.publisher import Publisher
from tests.integration.builtin_proc import BuiltinEngineProc, free_port
from tests.integration.nodeagent_harness import Agent, EventTail, start_command, stop_command, write_config

pytestmark = pytest.mark.timeout(240)

TIMEOUT = 0.4
CFG = HealthCheckConfig(timeout=TIMEOUT, retry_attempts=3, interval=0.1, startup_timeout=60)


async def faults(s: aiohttp.ClientSession, eng: BuiltinEngineProc, **patch: object) -> dict[str, object]:
    async with s.post(eng.url + "/admin/faults", json=patch) as r:
        assert r.status == 200, await r.text()
        answer: dict[str, object] = orjson.loads(await r.read())
        return answer


async def health_requests(s: aiohttp.ClientSession, eng: BuiltinEngineProc) -> int:
    async with s.get(eng.url + "/admin/faults") as r:
        return int(orjson.loads(await r.read())["health_requests"])


async def timed_check(s: aiohttp.ClientSession, url: str) -> tuple[bool, str, float]:
    t0 = time.monotonic()
    ok, detail = await check(s, url, CFG)
    return ok, detail, time.monotonic() - t0


async def test_health_check_retries_timeouts_only(tmp_path: Path) -> None:
    with BuiltinEngineProc(tmp_path, "--fast", name="health") as eng:
        url = eng.url + "/health"
        async with aiohttp.ClientSession() as s:
            # Two hung requests, then an answer: one check, three requests, passes.
            await faults(s, eng, hang_health_count=2)
            before = await health_requests(s, eng)
            ok, _, took = await timed_check(s, url)
            assert ok and took >= 2 * TIMEOUT
            assert await health_requests(s, eng) - before == 3

            # Three hung requests: the check fails after its three attempts.
            await faults(s, eng, hang_health_count=3)
            before = await health_requests(s, eng)
            ok, detail, took = await timed_check(s, url)
            assert not ok and "timed out 3 times" in detail and took >= 3 * TIMEOUT
            assert await health_requests(s, eng) - before == 3

            # An HTTP error is an answer: one request, no retry, no waiting.
            await faults(s, eng, hang_health_count=0, health_status=500)
            before = await health_requests(s, eng)
            ok, detail, took = await timed_check(s, url)
            assert not ok and detail == "HTTP 500" and took < TIMEOUT
            assert await health_requests(s, eng) - before == 1
            await faults(s, eng, reset=True)
            assert (await timed_check(s, url))[0]


async def test_startup_refusals_keep_starting_then_ready_then_a_refusal_is_abnormal(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/health"
    tracker = HealthTracker(CFG, started=time.monotonic())
    async with aiohttp.ClientSession() as s:
        for _ in range(3):  # nothing listens yet: the engine is "loading"
            ok, detail, took = await timed_check(s, url)
            assert not ok and "connection failed" in detail and took < TIMEOUT
            assert tracker.observe(ok, detail, time.monotonic()) is None
        assert tracker.status == EndpointStatus.STARTING
        with BuiltinEngineProc(tmp_path, "--fast", port=port, name="late") as eng:
            ok, detail, _ = await timed_check(s, url)
            t = tracker.observe(ok, detail, time.monotonic())
            assert t is not None and t.status == EndpointStatus.READY
            eng.stop()
        ok, detail, took = await timed_check(s, url)
        assert not ok and took < TIMEOUT  # a refused connection is not retried
        t = tracker.observe(ok, detail, time.monotonic())
        assert t is not None and t.status == EndpointStatus.ABNORMAL and "connection failed" in t.reason


def about(cls: type, node: str):  # type: ignore[no-untyped-def]
    return lambda ev: isinstance(ev, cls) and ev.data.node_id == node


async def test_fault_reporter_runs_when_the_engine_enables_fault_tolerance(
    tmp_path: Path, nats_server: object, js: JetStreamContext, tail: EventTail, agents: list[Agent]
) -> None:
    node = f"n-{new_id()[-10:]}"
    section = {
        "engine_config": {"fast": True, "num_blocks": 512, "enable_fault_tolerance": True},
        "fault_tolerance": {"poll_interval": 0.3},
    }
    cfg = write_config(tmp_path / "cluster.json", section)  # no nodeagent.fault_reporter, no flag
    agent = Agent(tmp_path, cfg, node, nats_server.url).start()  # type: ignore[attr-defined]
    agents.append(agent)
    reg = await tail.wait(about(NodeRegistered, node))
    await Publisher(js).publish(start_command(node, reg.data.endpoints))
    await tail.wait(
        lambda ev: about(EndpointStatusChanged, node)(ev) and ev.data.status == EndpointStatus.READY
    )
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"http://127.0.0.1:{agent.engine_port}/admin/faults", json={"ft_status": "dead"}
        ) as r:
            assert r.status == 200
        t0 = time.monotonic()
        fault = await tail.wait(about(FaultReported, node), within=20)
        # At poll_interval 0.3 s, not the 5 s default.
        assert time.monotonic() - t0 < 4.0
        assert fault.data.code == "engine_dead" and fault.data.level == FaultLevel.L5


async def test_abnormal_node_declares_itself_failed_and_rejoins_once_stopped(
    tmp_path: Path, nats_server: object, js: JetStreamContext, tail: EventTail, agents: list[Agent]
) -> None:
    node = f"n-{new_id()[-10:]}"
    section = {"health_check_config": {"interval": 0.2, "timeout": 0.5, "startup_timeout": 60}}
    cfg = write_config(tmp_path / "cluster.json", section, suicide_threshold=3)
    agent = Agent(tmp_path, cfg, node, nats_server.url).start()  # type: ignore[attr-defined]
    agents.append(agent)
    reg = await tail.wait(about(NodeRegistered, node))
    pub = Publisher(js)
    await pub.publish(start_command(node, reg.data.endpoints))
    await tail.wait(
        lambda ev: about(EndpointStatusChanged, node)(ev) and ev.data.status == EndpointStatus.READY
    )

    async with aiohttp.ClientSession() as s:
        url = f"http://127.0.0.1:{agent.engine_port}/admin/faults"
        async with s.post(url, json={"health_status": 503}) as r:
            assert r.status == 200
    abnormal = await tail.wait(
        lambda ev: about(EndpointStatusChanged, node)(ev) and ev.data.status == EndpointStatus.ABNORMAL
    )
    assert "HTTP 503" in abnormal.data.reason
    fault = await tail.wait(about(FaultReported, node), within=30)
    assert fault.data.code == "NODE_SUICIDE" and fault.data.level == FaultLevel.L5
    assert "3 consecutive heartbeats" in fault.data.message
    # 3 heartbeats (0.3 s apart) after the endpoint went ABNORMAL, not at once.
    assert fault.ts - abnormal.ts >= 0.5

    await pub.publish(stop_command(node))  # what the controller does with an L5 node fault
    cleared = await tail.wait(about(FaultCleared, node), within=30)
    assert cleared.data.fault_id == fault.data.fault_id
