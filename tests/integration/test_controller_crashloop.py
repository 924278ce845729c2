"""The restart ladder and the node agent's own faults, with a real controller, agents and engines.

- A builtin engine that dies after every first request (`crash_after: 1`) is restarted at
  once, then after a growing backoff, and on its `restart_limit`-th crash in a row the instance
  is failed over to the spare node; `motor replay --verify` re-derives every decision.
- The node agent frozen (SIGSTOP) past `heartbeat_timeout`, or killed (SIGKILL) and started
  again, never costs its engine a restart: the same engine process serves throughout and the
  instance is ACTIVE again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from controller.decide import decide
from core.config import config_from_dict
from replay.verify import verify
from tests.integration.controller_harness import CONTROLLER, SECTION, Cluster, engine_pid, state_is
from tests.integration.nodeagent_harness import Agent, pid_alive

pytestmark = pytest.mark.timeout(300)


def crashing_config(path: Path, **controller: Any) -> Path:
    section = {**SECTION, "instances": 1, "engine_config": {**SECTION["engine_config"], "crash_after": 1}}
    cfg = {
        "controller": {**CONTROLLER, **controller},
        "nodeagent": {"heartbeat_interval": 0.3, "stop_grace": 3.0},
        "union": section,
    }
    path.write_bytes(orjson.dumps(cfg))
    return path


async def one_request(agent: Agent) -> None:
    """One completion straight to the agent's engine (it exits right after answering)."""
    url = f"http://127.0.0.1:{agent.engine_port}/v1/completions"
    body = {"model": "motor-sim", "prompt": "hello", "max_tokens": 2}
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        assert r.status == 200, await r.text()


def of_type(kind: str, **want: Any):  # type: ignore[no-untyped-def]
    return lambda ev: ev.type == kind and all(getattr(ev.data, k) == v for k, v in want.items())


async def test_a_crash_looping_engine_backs_off_then_its_instance_fails_over(cluster: Cluster) -> None:
    cluster.config = crashing_config(
        cluster.tmp / "cluster.json",
        restart_backoff_initial=1.0,
        restart_backoff_max=8.0,
        restart_reset_after=120.0,
        restart_limit=3,
    )
    await cluster.controller("c1").wait_http("/readiness")
    cluster.agent("n1")
    tail = cluster.tail
    asm = await tail.wait(lambda ev: ev.type == "instance.assembled", within=120)
    cluster.agent("n2")  # the spare, registered after the instance took n1
    iid = asm.data.instance_id
    assert [m.node_id for m in asm.data.members] == ["n1"]
    n1 = cluster.agents["n1"]

    waits: list[float] = []
    mark = 0
    for crash in (1, 2):
        await tail.wait(state_is(iid, "ACTIVE"), after=mark, within=60)
        mark = tail.index()
        await one_request(n1)
        dead = await tail.wait(of_type("endpoint.status_changed", node_id="n1", status="DEAD"), after=mark)
        assert dead.data.exit_code == 3
        stop = await tail.wait(of_type("command.stop", node_id="n1"), after=mark, within=20)
        start = await tail.wait(of_type("command.start", node_id="n1"), after=mark, within=30)
        assert start.data.restarts == crash
        waits.append(start.ts - stop.ts)
        mark = tail.index()
    assert waits[0] < 1.0, waits  # the first restart does not wait
    assert waits[1] >= 1.0, waits  # the second waits restart_backoff_initial
    recovering = tail.events(state_is(iid, "RECOVERING"))[-1]
    assert "crash 2 in a row after READY: restart after a 1s backoff" in recovering.data.reason

    # The third crash in a row: failed over, not restarted.
    await tail.wait(state_is(iid, "ACTIVE"), after=mark, within=60)
    mark = tail.index()
    await one_request(n1)
    fault = await tail.wait(of_type("fault.reported", code="CrashLoop"), after=mark, within=20)
    assert fault.data.node_id == "n1" and fault.data.level == "L5"
    assert "crashed 3 times in a row after READY" in fault.data.message
    iso = await tail.wait(state_is(iid, "ISOLATED"), after=mark, within=20)
    assert "failing instance" in iso.data.reason
    await tail.wait(state_is(iid, "TERMINATED"), after=mark, within=20)
    moved = await tail.wait(lambda ev: ev.type == "instance.assembled", after=mark, within=30)
    assert [m.node_id for m in moved.data.members] == ["n2"]
    await tail.wait(state_is(moved.data.instance_id, "ACTIVE"), after=mark, within=60)
    assert tail.events(of_type("command.start", node_id="n1"), after=mark) == []

    # The whole story is re-derived from the log alone.
    assert cluster.config is not None
    cfg = config_from_dict(orjson.loads(cluster.config.read_bytes()))
    report = verify(tail.records, lambda s, t: decide(s, cfg, t))
    assert report.ok, [m.render() for m in report.mismatches]


async def up_one(cluster: Cluster) -> tuple[int, Agent, int]:
    cluster.configure(union=1)
    await cluster.controller("c1").wait_http("/readiness")
    agent = cluster.agent("n1")
    asm = await cluster.tail.wait(lambda ev: ev.type == "instance.assembled", within=120)
    iid = asm.data.instance_id
    await cluster.tail.wait(state_is(iid, "ACTIVE"), within=120)
    return iid, agent, await engine_pid(agent)


def restarts_of(cluster: Cluster, after: int) -> list[str]:
    """Commands sent to n1 since `after`: a restart would show here."""
    return [ev.type for ev in cluster.tail.events(lambda ev: ev.type.startswith("command."), after=after)]


async def test_agent_frozen_past_heartbeat_timeout_resumes_without_restarting_its_engine(
    cluster: Cluster,
) -> None:
    iid, agent, pid = await up_one(cluster)
    assert agent.proc is not None
    mark = cluster.tail.index()
    os.kill(agent.proc.pid, signal.SIGSTOP)
    try:
        await cluster.tail.wait(state_is(iid, "INACTIVE"), after=mark, within=15)
        await asyncio.sleep(3.0)  # well past heartbeat_timeout (2 s): the freeze itself
    finally:
        os.kill(agent.proc.pid, signal.SIGCONT)
    back = await cluster.tail.wait(state_is(iid, "ACTIVE"), after=mark, within=20)
    assert "heartbeat" in back.data.reason
    assert await engine_pid(agent) == pid
    assert restarts_of(cluster, mark) == []
    assert agent.proc.poll() is None


async def test_agent_killed_and_started_again_adopts_its_engine_without_a_restart(cluster: Cluster) -> None:
    iid, agent, pid = await up_one(cluster)
    mark = cluster.tail.index()
    agent.kill9()
    assert pid_alive(pid)
    assert cluster.config is not None
    again = Agent(
        cluster.tmp, cluster.config, "n1", cluster.nats_url,
        port=agent.port, engine_port=agent.engine_port, marker=agent.marker,
    ).start()  # fmt: skip
    cluster.agents["n1"] = again
    reg = await cluster.tail.wait(
        lambda ev: ev.type == "node.registered" and ev.data.node_id == "n1", after=mark, within=60
    )
    assert reg.data.instance_id == iid and reg.data.running_endpoints == (0,)
    # The registration resets the fold's view of its endpoints to STARTING; READY is said again
    # after it, and the instance is ACTIVE again (maybe by way of INACTIVE or DEGRADED).
    at = cluster.tail.index()
    await cluster.tail.wait(
        lambda ev: ev.type == "endpoint.status_changed" and ev.data.status == "READY", after=at - 1, within=30
    )
    deadline = time.monotonic() + 30
    while _last_state(cluster, iid) != "ACTIVE":
        assert time.monotonic() < deadline, cluster.logs()
        await asyncio.sleep(0.1)  # the controller's next tick: nothing single to await
    assert await engine_pid(again) == pid
    assert restarts_of(cluster, mark) == []


def _last_state(cluster: Cluster, iid: int) -> str | None:
    moves = cluster.tail.events(lambda ev: ev.type == "instance.state_changed" and ev.data.instance_id == iid)
    return str(moves[-1].data.state) if moves else None
