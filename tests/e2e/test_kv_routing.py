"""KV-cache-aware routing from the engines' own KV events, on a whole local cluster.

Real processes: nats-server (per-role users: a permission the node agent or the coordinator
lacks fails the cluster's teardown check), a controller, two coordinator replicas on one
port, node agents, and two builtin engines publishing KV events over ZMQ PUB + replay. Run
in order (module-scoped cluster).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest

from core.events import InstanceState
from tests.localcluster import Harness, cluster_config, kill_child, restart_child, running_cluster

SYSTEM = "You are the support assistant of a control plane for distributed inference. " * 40


def _body(user: str) -> dict[str, Any]:
    return {
        "model": "motor-sim",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "max_tokens": 4,
    }


@pytest.fixture(scope="module")
async def kvh(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Harness]:
    events = {"kv_events_config": {"enable_kv_cache_events": True}}
    cfg = cluster_config(
        union={"instances": 2, "engine_config": events},
        prefill={"instances": 0},
        decode={"instances": 0},
        coordinator={"policy": {"union": "kv_aware"}},
    )
    async with running_cluster(
        tmp_path_factory.mktemp("kv"),
        cfg,
        nodes=2,
        coordinators=2,
        ready="two ACTIVE union instances",
        ready_pred=lambda s: sum(1 for i in s.instances.values() if i.state == InstanceState.ACTIVE) >= 2,
    ) as h:
        yield h


async def _get(session: aiohttp.ClientSession, url: str, **kw: Any) -> Any:
    async with session.get(url, **kw) as r:
        assert r.status == 200, await r.text()
        return await r.json(content_type=None)


async def views(h: Harness) -> list[dict[str, Any]]:
    """Each coordinator replica's /v1/kvview, asked on its own Unix socket."""
    out = []
    for name in h.cluster.coordinator_names():
        conn = aiohttp.UnixConnector(path=str(h.cluster.probe_socket(name)))
        async with aiohttp.ClientSession(connector=conn) as s:
            out.append(await _get(s, "http://x/v1/kvview"))
    return out


def _summary(view: dict[str, Any]) -> dict[str, tuple[int, str]]:
    return {d["endpoint"]: (d["blocks"], d["digest"]) for d in view["data"]}


async def until(what: str, pred: Callable[[], Any], within: float = 20.0) -> Any:
    deadline = time.monotonic() + within
    last = None
    while time.monotonic() < deadline:
        last = await pred()
        if last:
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last}")


async def agreed_views(h: Harness, want: Callable[[dict[str, tuple[int, str]]], bool]) -> Any:
    seen: list[Any] = []

    async def check() -> dict[str, tuple[int, str]] | None:
        a, b = (_summary(v) for v in await views(h))
        seen[:] = [a, b]
        return a if a == b and want(a) else None

    try:
        return await until("both replicas folding the same KV view", check)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: the replicas' views {seen}") from None


async def send(h: Harness, user: str) -> None:
    async with aiohttp.ClientSession() as s, s.post(h.base_url + "/chat/completions", json=_body(user)) as r:
        assert r.status == 200, await r.text()
        await r.read()


def engine_urls(h: Harness) -> dict[str, str]:
    """Endpoint key → the engine's base URL."""
    out = {}
    for node_id, node in h.state.nodes.items():
        if node.reg is not None:
            for ep in node.reg.endpoints:
                out[f"{node_id}/{ep.id}"] = f"http://{ep.ip}:{ep.business_port}"
    return out


async def served_by(h: Harness, marker: str) -> list[str]:
    """The endpoints whose engine parsed a request whose prompt holds `marker`."""
    hits = []
    async with aiohttp.ClientSession() as s:
        for key, url in engine_urls(h).items():
            seen = await _get(s, url + "/admin/requests")
            if any(marker in (row.get("prompt") or "") for row in seen):
                hits.append(key)
    return hits


async def agent_metric(h: Harness, name: str) -> float:
    total = 0.0
    async with aiohttp.ClientSession() as s:
        for node in h.state.nodes.values():
            if node.reg is None or node.reg.agent_url is None:
                continue
            async with s.get(node.reg.agent_url + "/metrics") as r:
                for line in (await r.text()).splitlines():
                    if line.startswith(name) and not line.startswith("#"):
                        total += float(line.rsplit(" ", 1)[1])
    return total


async def test_replicas_agree_and_route_to_the_cache(kvh: Harness) -> None:
    h = kvh
    await send(h, "first question marker-0")
    first = await served_by(h, "marker-0")
    assert len(first) == 1
    (holder,) = first
    got = await agreed_views(h, lambda v: v.get(holder, (0, ""))[0] > 20)
    assert all(n == 0 for key, (n, _) in got.items() if key != holder), got
    for i in range(1, 7):  # sequential: equal loads, so only the cache tells them apart
        await send(h, f"follow-up marker-{i}")
        assert await served_by(h, f"marker-{i}") == [holder], (
            f"request {i} left the engine holding its prefix"
        )


async def test_a_gap_is_recovered_from_the_replay_socket(kvh: Harness) -> None:
    """Each engine keeps its next batch off the PUB socket; both agents fetch it from replay
    (one of the engines may never have published before: its first batch is sequence 0)."""
    h = kvh
    async with aiohttp.ClientSession() as s:
        for url in engine_urls(h).values():
            async with s.post(url + "/admin/kv_events", json={"drop": 1}) as r:
                assert r.status == 200, await r.text()
        # Straight to each engine: the dropped batch is this prompt's, the next one shows the gap.
        other = "An entirely different preamble about cooking pasta and the sauces that go with it. " * 30
        for url in engine_urls(h).values():
            for i in range(2):
                body = {
                    "model": "motor-sim",
                    "messages": [{"role": "user", "content": f"{other} {i}" * (i + 1)}],
                }
                async with s.post(url + "/v1/chat/completions", json={**body, "max_tokens": 2}) as r:
                    assert r.status == 200, await r.text()
    try:
        await until("a recovered gap on every engine", lambda: _gaps_recovered(h, 2))
    except AssertionError:
        raise AssertionError(f"gaps not recovered: {await _kv_lines(h)}") from None
    # And the view holds what the engines hold: after a flush on every engine it is empty.
    async with aiohttp.ClientSession() as s:
        for url in engine_urls(h).values():
            async with s.post(url + "/flush_cache") as r:
                assert r.status == 200
    await agreed_views(h, lambda v: bool(v) and all(n == 0 for n, _ in v.values()))


async def _kv_lines(h: Harness) -> list[str]:
    out = []
    async with aiohttp.ClientSession() as s:
        for node in h.state.nodes.values():
            if node.reg is not None and node.reg.agent_url is not None:
                async with s.get(node.reg.agent_url + "/metrics") as r:
                    out += [
                        ln for ln in (await r.text()).splitlines() if "_kv_" in ln and not ln.startswith("#")
                    ]
    return out


async def _gaps_recovered(h: Harness, n: int) -> bool:
    lines = await _kv_lines(h)
    recovered = sum(float(ln.rsplit(" ", 1)[1]) for ln in lines if 'outcome="recovered"' in ln)
    return recovered >= n and not any('outcome="lost"' in ln for ln in lines)


async def test_malformed_frames_are_counted_and_skipped(kvh: Harness) -> None:
    h = kvh
    async with aiohttp.ClientSession() as s:
        for url in engine_urls(h).values():
            async with s.post(url + "/admin/kv_events", json={"garbage": 6}) as r:
                assert r.status == 200
    await until(
        "malformed frames counted",
        lambda: _at_least(h, "motor_nodeagent_kv_frames_malformed_total", 12),
    )
    # The agents are alive and still fold: a new prefix shows up in both replicas' views.
    await send(h, "after the garbage marker-g")
    (holder,) = await served_by(h, "marker-g")
    await agreed_views(h, lambda v: v.get(holder, (0, ""))[0] > 20)


async def _at_least(h: Harness, name: str, n: float) -> bool:
    return await agent_metric(h, name) >= n


async def test_nats_away_the_view_catches_up(kvh: Harness) -> None:
    h = kvh
    server = h.cluster.nats
    await server.kill()
    # Engines keep serving and storing while the log is away (straight to the engine).
    async with aiohttp.ClientSession() as s:
        for url in engine_urls(h).values():
            async with s.post(url + "/v1/chat/completions", json=_body("while NATS is away marker-n")) as r:
                assert r.status == 200
    await asyncio.sleep(1.0)
    await server.start()
    await agreed_views(h, lambda v: len(v) == 2 and all(n > 20 for n, _ in v.values()))
    await send(h, "after the outage marker-after")  # and routing goes on


async def test_a_new_replica_is_not_cache_blind(kvh: Harness) -> None:
    """A replica started now (killed -9 and started again) folds every engine's view at once."""
    h = kvh
    name = h.cluster.coordinator_names()[-1]
    kill_child(h.cluster, name)
    child = h.cluster.child(name)
    assert child.proc is not None
    await asyncio.to_thread(child.proc.wait, 10)
    sock = h.cluster.probe_socket(name)
    sock.unlink(missing_ok=True)
    restart_child(h.cluster, name)

    async def answers() -> bool:
        try:
            await views(h)
        except (aiohttp.ClientError, OSError, AssertionError):
            return False
        return True

    await until("the new replica answering", answers, within=60.0)
    got = await agreed_views(h, lambda v: len(v) == 2 and all(n > 20 for n, _ in v.values()))
    assert len(got) == 2
