"""Graceful drain, rolling restart and run-time scale on a whole local cluster (issue 21 item 1).

Real processes: nats-server (per-role users, so a permission the controller, a node agent or
the operator CLI lacks fails), a controller, a coordinator, three node agents with builtin
engines (two union instances and a spare node). Clients are the official `openai` SDK; the
operator acts through the `motor` CLI. Run in order (module-scoped cluster).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from core.events import InstanceState, Role
from tests.e2e.test_cluster import motor
from tests.localcluster import Harness, cluster_config, kill_child, restart_child, running_cluster

TOKENS = 30  # at 60 ms a token: a stream of ~2 s


def _active(s: Any) -> list[int]:
    return sorted(
        i for i, r in s.instances.items() if r.state == InstanceState.ACTIVE and i not in s.ops.drains
    )


@pytest.fixture(scope="module")
async def h(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Harness]:
    cfg = cluster_config(
        union={"instances": 2, "engine_config": {"slow_tokens_ms": 60}},
        prefill={"instances": 0},
        decode={"instances": 0},
        controller={"drain_timeout": 20.0},
        nodeagent={"drain_timeout": 20.0, "drain_settle": 0.5},
    )
    async with running_cluster(
        tmp_path_factory.mktemp("drain"),
        cfg,
        nodes=3,
        ready="two ACTIVE union instances",
        ready_pred=lambda s: len(_active(s)) >= 2,
    ) as harness:
        yield harness


async def _stream(client: openai.AsyncOpenAI, i: int, rid: str = "") -> tuple[str, int]:
    stream = await client.completions.create(
        model="motor-sim",
        prompt=f"Story {i} of a drained fleet",
        max_tokens=TOKENS,
        stream=True,
        extra_headers={"x-request-id": rid} if rid else None,
    )
    pieces = [c.choices[0].text async for c in stream if c.choices]
    return "".join(pieces), len([p for p in pieces if p])


async def _records(h: Harness, failed: dict[int, BaseException]) -> dict[int, str]:
    conn = aiohttp.UnixConnector(path=str(h.cluster.probe_socket("coordinator")))
    out: dict[int, str] = {}
    async with aiohttp.ClientSession(connector=conn) as s:
        for i in failed:
            async with s.get(f"http://coordinator/v1/requests/sigterm-{i}") as resp:
                out[i] = await resp.text()
    return out


async def _whole(client: openai.AsyncOpenAI, i: int) -> str:
    r = await client.completions.create(model="motor-sim", prompt=f"Question {i}", max_tokens=4)
    return r.choices[0].text


async def test_a_drain_under_32_streams_loses_none(h: Harness) -> None:
    client = openai.AsyncOpenAI(base_url=h.base_url, api_key="x", max_retries=0, timeout=60)
    before = _active(h.state)
    victim = before[0]
    streams = [asyncio.create_task(_stream(client, i)) for i in range(32)]
    await asyncio.sleep(0.7)  # every stream under way, on both instances
    proc = await motor(h, "drain", "instance", str(victim), "--timeout", "20")
    assert f"instance {victim} drained and stopped" in proc.stdout, proc.stdout
    results = await asyncio.gather(*streams)
    assert all(n == TOKENS for _, n in results), [n for _, n in results]  # every text complete
    # Drained means it finished its streams, not that it was cut: the stop says so.
    assert h.seen("operator.drain_requested", instance_id=victim)
    applied = [r.event for r in h.log if r.event.type == "command.applied" and r.event.data.verb == "stop"]
    assert any("drained: engines idle" in e.data.detail for e in applied), [e.data.detail for e in applied]
    assert h.seen("instance.state_changed", instance_id=victim, state=InstanceState.TERMINATED)
    # Its node is free, not cordoned: a fresh instance is built; the fleet serves two again.
    await h.wait_for("two ACTIVE instances again", lambda s: len(_active(s)) >= 2, within=60)
    assert victim not in h.state.instances


async def test_a_rolling_restart_under_traffic_fails_no_request(h: Harness) -> None:
    client = openai.AsyncOpenAI(base_url=h.base_url, api_key="x", max_retries=0, timeout=60)
    old = set(h.state.instances)
    failures: list[str] = []
    served = 0
    stop = asyncio.Event()

    async def loop(k: int) -> None:
        nonlocal served
        i = 0
        while not stop.is_set():
            i += 1
            try:
                if k % 2:
                    _, n = await _stream(client, i)
                    assert n == TOKENS, f"stream cut at {n} tokens"
                else:
                    assert await _whole(client, i)
                served += 1
            except Exception as exc:  # every failure is the test's finding
                failures.append(f"{type(exc).__name__}: {exc}")

    loops = [asyncio.create_task(loop(k)) for k in range(6)]
    try:
        proc = await motor(h, "restart", "--rolling", "motor-sim", "--timeout", "20", "--wait-timeout", "150")
    finally:
        stop.set()
        await asyncio.gather(*loops)
    assert "rolling restart of motor-sim done" in proc.stdout, proc.stdout
    assert not failures, failures[:5]
    assert served > 20
    assert not old & set(h.state.instances)  # every instance is new
    assert h.seen("controller.rollout_completed", model="motor-sim")
    assert len(_active(h.state)) == 2


async def test_node_drain_cordons_and_scale_moves_the_count(h: Harness) -> None:
    node = next(n for n, r in h.state.nodes.items() if r.instance_id is not None)
    await motor(h, "drain", "node", node, "--timeout", "5")
    assert node in h.state.ops.cordoned
    await h.wait_for(
        "two ACTIVE instances, none on the cordoned node", lambda s: len(_active(s)) >= 2, within=60
    )
    assert h.state.nodes[node].instance_id is None
    proc = await motor(h, "scale", "union=1", "--wait-timeout", "60")
    assert "union: 1/1 ACTIVE" in proc.stdout, proc.stdout
    await motor(h, "uncordon", node)
    proc = await motor(h, "scale", "union=2", "--wait-timeout", "60")
    assert "union: 2/2 ACTIVE" in proc.stdout
    bad = await motor(h, "scale", "gpu=2", check=False)
    assert bad.returncode == 2 and "ROLE one of" in bad.stderr


async def test_a_node_agent_stopped_with_sigterm_drains_first(h: Harness) -> None:
    client = openai.AsyncOpenAI(base_url=h.base_url, api_key="x", max_retries=0, timeout=60)
    node = next(n for n, r in sorted(h.state.nodes.items()) if r.instance_id is not None)
    iid = h.state.nodes[node].instance_id
    streams = [asyncio.create_task(_stream(client, i, f"sigterm-{i}")) for i in range(16)]
    await asyncio.sleep(0.7)
    kill_child(h.cluster, f"nodeagent-{node}", signal.SIGTERM)
    results = await asyncio.gather(*streams, return_exceptions=True)
    failed = {i: r for i, r in enumerate(results) if isinstance(r, BaseException)}
    if failed:  # what the coordinator recorded of each, for the failure message
        raise AssertionError(f"streams failed: {failed}; records: {await _records(h, failed)}")
    assert all(n == TOKENS for _, n in results), [n for _, n in results]
    assert any(
        r.event.type == "operator.drain_requested"
        and r.event.data.node_id == node
        and not r.event.data.cordon
        for r in h.log
    )
    await h.wait_for(f"instance {iid} gone", lambda s: iid not in s.instances, within=60)
    restart_child(h.cluster, f"nodeagent-{node}")
    await h.wait_for("two ACTIVE instances again", lambda s: len(_active(s)) >= 2, within=90)
    assert Role.UNION in {r.spec.role for r in h.state.instances.values()}
