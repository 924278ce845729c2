"""A 3-node NATS cluster whose heartbeat stream loses its leader: no heartbeat lands until the
other servers elect one (nats-server's Raft waits 4-9 s), and the controllers must not charge
that silence to the nodes (controller/hearing.py). With a heartbeat timeout shorter than an
election, a controller that judged it would take every instance out of routing."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import aiohttp
import orjson

from core.events import InstanceState
from streams.connection import connect
from streams.definitions import HB_STREAM
from streams.placement import stream_placement
from tests.localcluster import cluster_config, running_cluster

HEARTBEAT_TIMEOUT = 2.0  # well under any election


async def _lead_on(nc: object, stream: str, server: str) -> None:
    js = nc.jetstream()  # type: ignore[attr-defined]
    deadline = time.monotonic() + 30
    while (await stream_placement(js, stream)).leader != server:
        assert time.monotonic() < deadline, f"{stream} never led by {server}"
        with contextlib.suppress(Exception):
            await nc.request(  # type: ignore[attr-defined]
                f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}",
                orjson.dumps({"placement": {"preferred": server}}),
                timeout=5,
            )
        await asyncio.sleep(1.0)


async def _controller_servers(h: object, admin: object) -> set[str]:
    """The servers the controller depends on for heartbeats: the one it is connected to and
    the one holding its heartbeat consumer (losing either already deafens it)."""
    cluster = h.cluster  # type: ignore[attr-defined]
    used: set[str] = set()
    async with aiohttp.ClientSession() as s:
        for m in cluster.nats_members:
            async with s.get(f"http://127.0.0.1:{m.monitor_port}/connz") as r:
                conns = (await r.json()).get("connections") or []
            if any(str(c.get("name", "")).startswith("motor-controller-") for c in conns):
                used.add(m.name)
    resp = await admin.request(f"$JS.API.CONSUMER.LIST.{HB_STREAM}", b"{}", timeout=5)  # type: ignore[attr-defined]
    for c in orjson.loads(resp.data).get("consumers") or []:
        if str(c["config"].get("deliver_subject", "")).startswith("_INBOX.controller."):
            used.add(c["cluster"]["leader"])
    return used


async def test_a_leaderless_heartbeat_stream_judges_no_node_silent(tmp_path: Path) -> None:
    cfg = cluster_config(prefill=None, decode=None, controller={"heartbeat_timeout": HEARTBEAT_TIMEOUT})
    async with running_cluster(
        tmp_path,
        cfg,
        nodes=1,
        nats_cluster=3,
        standby=False,
        ready="the union instance ACTIVE",
        ready_pred=lambda s: any(i.state == InstanceState.ACTIVE for i in s.instances.values()),
    ) as h:
        admin = await connect(h.cluster.client_options("admin"), name="e2e-admin")
        try:
            # A server the controller neither talks to nor reads heartbeats through: its own
            # connection and consumer carry on, so only the stream's silence is left to judge.
            used = await _controller_servers(h, admin)
            free = sorted({m.name for m in h.cluster.nats_members} - used)
            assert free, f"the controller uses every server: {used}"
            leader = free[0]
            await _lead_on(admin, HB_STREAM, leader)
            seq0 = h.state.last_seq
            server = h.cluster.nats_servers.server(leader)
            await server.kill()
            killed = time.time()
            # Until the others elect leaders and a while after: every heartbeat timeout passes.
            deadline = time.monotonic() + 30
            while (await stream_placement(admin.jetstream(), HB_STREAM, within=1.0)).leader in (None, leader):
                assert time.monotonic() < deadline, "no new leader of the heartbeat stream"
                await asyncio.sleep(0.2)
            elected = time.time() - killed
            await asyncio.sleep(3 * HEARTBEAT_TIMEOUT)
            judged = [
                (r.seq, r.event.data.state, r.event.data.reason)
                for r in h.log
                if r.seq > seq0 and r.event.type == "instance.state_changed"
            ]
            assert judged == [], f"judged by the election ({elected:.1f} s): {judged}"
            assert all(i.state == InstanceState.ACTIVE for i in h.state.instances.values())
            print(f"the heartbeat stream elected a leader {elected:.1f} s after the kill; nobody judged")
            await server.start()
        finally:
            await admin.close()
