"""Controllers through faults, real processes: NATS away, poison events, leader kills and freezes.

Each test fails on the controller before issue 11: it exited on `nats: timeout`, crashed on a
decodable-but-inapplicable event, judged nodes by the outage, took ~5 s to fail over.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import time
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest_asyncio
from nats.js import JetStreamContext

from core.codec import encode
from core.config import ControllerConfig
from core.events import (
    CommandRefused,
    CommandRefusedData,
    FaultReported,
    FaultReportedData,
    InstancesRefreshed,
    InstancesRefreshedData,
)
from core.ids import new_id
from streams.connection import connect
from streams.definitions import ensure_streams
from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.integration.controller_harness import Cluster, Controller, cluster_config, operator_event, state_is


@pytest_asyncio.fixture(loop_scope="session")
async def own_nats(tmp_path: Path) -> AsyncIterator[tuple[Cluster, EmbeddedNats]]:
    """A cluster on a nats-server of this test alone (to kill -9 and start again on its store)."""
    server = EmbeddedNats(tmp_path / "nats", log_file=tmp_path / "nats.log")
    await server.start()
    nc = await connect(server.url, name="pytest-own", retry_initial=True)
    await ensure_streams(nc.jetstream())
    c = Cluster(tmp_path, server.url, nc)
    await c.start_tail()
    try:
        yield c, server
    finally:
        await c.close()
        await nc.close()
        await server.stop()


async def leader_of(cluster: Cluster, within: float = 30.0) -> Controller:
    """The controller whose /readiness says leader."""
    deadline = time.monotonic() + within
    while True:
        for c in cluster.controllers.values():
            if c.proc is not None and c.proc.poll() is None:
                try:
                    status, _ = await c.get("/readiness")
                except OSError:
                    continue
                if status == 200:
                    return c
        assert time.monotonic() < deadline, f"no leader within {within}s\n{cluster.logs()}"
        await asyncio.sleep(0.1)  # polling processes: nothing to await


async def test_nats_down_15s_controllers_survive_and_nobody_is_judged_by_the_outage(
    own_nats: tuple[Cluster, EmbeddedNats],
) -> None:
    cluster, server = own_nats
    cluster.configure(union=1)  # heartbeat_timeout 2 s: a 15 s outage is 7 timeouts
    c1 = cluster.controller("c1")
    await c1.wait_http("/readiness")
    c2 = cluster.controller("c2")
    await c2.wait_http("/liveness")
    cluster.agent("n1", "union")
    asm = await cluster.tail.wait(lambda ev: ev.type == "instance.assembled", within=120)
    iid = asm.data.instance_id
    await cluster.tail.wait(state_is(iid, "ACTIVE"), within=120)
    mark = cluster.tail.index()

    await server.kill()
    await asyncio.sleep(15.0)
    await server.start()
    back = time.monotonic()

    leader = await leader_of(cluster, within=60)
    print(f"a leader ({leader.id}) again {time.monotonic() - back:.1f}s after NATS came back")
    await asyncio.sleep(3 * 2.0 + 2.0)  # past heartbeat_timeout from when the controllers could hear
    for c in (c1, c2):
        assert c.proc is not None and c.proc.poll() is None, f"controller {c.id} exited\n{c.output()[-3000:]}"
        status, _ = await c.get("/liveness")
        assert status == 200
    judged = cluster.tail.events(
        lambda ev: ev.type == "instance.state_changed" and ev.data.state in ("INACTIVE", "TERMINATED"),
        after=mark,
    )
    assert judged == [], f"judged by the outage: {[e.data.reason for e in judged]}\n{cluster.logs()}"
    _, body = await leader.get("/v1/instances")
    assert [(i["id"], i["state"]) for i in body["instances"]] == [(iid, "ACTIVE")]


async def skipped(c: Controller) -> dict[str, float]:
    """`motor_controller_events_skipped_total` by reason, from the controller's /metrics."""
    _, text = await c.get("/metrics")
    out = {}
    for line in str(text).splitlines():
        if line.startswith("motor_controller_events_skipped_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            out[reason] = float(line.rsplit(" ", 1)[1])
    return out


async def test_poison_events_are_skipped_and_counted_and_the_leader_keeps_deciding(
    cluster: Cluster, js: JetStreamContext
) -> None:
    cluster.configure(union=1)
    c1 = cluster.controller("c1")
    await c1.wait_http("/readiness")
    good = operator_event(
        FaultReported, FaultReportedData(fault_id=new_id(), node_id="nobody", level="L1", code="x")
    )
    body = orjson.loads(encode(good))
    # Issue 11's event: decodable, but its instance has no id (crashed the leader with KeyError).
    no_id = operator_event(
        InstancesRefreshed, InstancesRefreshedData(event="add", ids=(), instances=({"ip": "1.2.3.4"},))
    )
    await Publisher(js).publish(no_id)
    await js.publish("motor.evt.fault.rogue", b"{not json")
    await js.publish("motor.evt.fault.rogue", orjson.dumps(body | {"id": new_id(), "type": "node.exploded"}))
    await js.publish("motor.evt.fault.rogue", orjson.dumps(body | {"id": new_id(), "schema_version": 99}))
    nan = orjson.dumps(body | {"id": new_id(), "ts": "@"}).replace(b'"@"', b"NaN")
    await js.publish("motor.evt.fault.rogue", nan)
    # The leader keeps deciding after them: a node registers and its instance comes up.
    cluster.agent("n1", "union")
    asm = await cluster.tail.wait(lambda ev: ev.type == "instance.assembled", within=120)
    await cluster.tail.wait(state_is(asm.data.instance_id, "ACTIVE"), within=120)

    want = {"undecodable": 2.0, "unknown_type": 1.0, "newer_schema": 1.0}
    assert await skipped(c1) == want
    assert "skipped, undecodable" in c1.output() and "Traceback" not in c1.output()
    # A restart replays the same events and comes up again.
    c1.kill9()
    c1 = cluster.controller("c1")
    await c1.wait_http("/readiness", within=60)
    assert await skipped(c1) == want


async def test_a_refusal_naming_seen_term_2_64_minus_1_leaves_the_cluster_a_leader(
    cluster: Cluster, js: JetStreamContext
) -> None:
    """Issue 24: one node's credentials may write `command.refused` on its own subject. With
    `seen_term: 2**64-1` the leader announced a reign past it, 2**64, which the 64-bit JSON
    encoder of its lease and checkpoints cannot write: it lost the lease and no controller
    could take it again. The refusal is poison now: skipped, counted, and nothing changes."""
    cluster.configure(union=1)
    c1 = cluster.controller("c1")
    await c1.wait_http("/readiness")
    c2 = cluster.controller("c2")
    await c2.wait_http("/liveness")
    cluster.agent("n1", "union")
    asm = await cluster.tail.wait(lambda ev: ev.type == "instance.assembled", within=120)
    await cluster.tail.wait(state_is(asm.data.instance_id, "ACTIVE"), within=120)
    (start,) = cluster.tail.events(lambda ev: ev.type == "command.start")
    data = CommandRefusedData(
        command_id=start.data.command_id,
        node_id="n1",
        verb="start",
        instance_id=start.data.instance_id,
        code="stale_term",
        reason="a rogue client with n1's credentials",
    )
    raw = orjson.loads(encode(CommandRefused(id=new_id(), ts=time.time(), source="nodeagent/n1", data=data)))
    raw["data"]["seen_term"] = 2**64 - 1
    mark = cluster.tail.index()
    await js.publish("motor.evt.node.n1", json.dumps(raw).encode())
    await asyncio.sleep(5.0)  # past a few lease renewals (TTL 1.5 s) and decide passes
    leader = await leader_of(cluster, within=1.0)
    assert leader.id == "c1", cluster.logs()
    assert (await skipped(c1)).get("undecodable") == 1.0
    assert cluster.tail.events(lambda ev: ev.type == "controller.leader_changed", after=mark) == []
    # The lease can still change hands: the standby leads after the leader dies.
    c1.kill9()
    assert (await leader_of(cluster, within=10.0)).id == "c2", cluster.logs()
    reign = await cluster.tail.wait(lambda ev: ev.type == "controller.leader_changed", after=mark)
    assert (reign.data.leader_id, reign.data.term) == ("c2", 2)
    assert "Traceback" not in c1.output() + c2.output()


async def test_failover_takes_under_3s_with_the_default_lease(cluster: Cluster) -> None:
    ttl = ControllerConfig().lease_ttl
    cluster.configure(union=1, lease_ttl=ttl)
    first = cluster.controller("c1")
    await first.wait_http("/readiness")
    cluster.controller("c2")
    cluster.agent("n1", "union")
    asm = await cluster.tail.wait(lambda ev: ev.type == "instance.assembled", within=120)
    await cluster.tail.wait(state_is(asm.data.instance_id, "ACTIVE"), within=120)
    took: list[float] = []
    for _ in range(3):
        leader = await leader_of(cluster)
        standby = next(c for c in cluster.controllers.values() if c is not leader)
        await standby.wait_http("/liveness")
        mark = cluster.tail.index()
        leader.kill9()
        killed = time.time()
        ann = await cluster.tail.wait(
            lambda ev, s=standby.id: ev.type == "controller.leader_changed" and ev.data.leader_id == s,
            after=mark,
            within=20,
        )
        took.append(ann.ts - killed)
        cluster.controller(leader.id)  # back as the standby
    # A clean stop gives the lease up: the standby takes over at once.
    leader = await leader_of(cluster)
    standby = next(c for c in cluster.controllers.values() if c is not leader)
    await standby.wait_http("/liveness")
    await asyncio.sleep(1.0)  # the standby has caught up and polls the lease
    mark = cluster.tail.index()
    assert leader.proc is not None
    leader.proc.send_signal(signal.SIGTERM)
    stopped = time.time()
    ann = await cluster.tail.wait(
        lambda ev: ev.type == "controller.leader_changed" and ev.data.leader_id == standby.id, after=mark
    )
    clean = ann.ts - stopped
    print(
        f"failover after kill -9 (lease {ttl}s): {', '.join(f'{t:.2f}s' for t in took)}; clean stop {clean:.2f}s"
    )
    assert statistics.median(took) < 3.0, took
    assert clean < 1.5, clean


async def test_a_frozen_leader_resumed_after_takeover_writes_nothing(cluster: Cluster) -> None:
    """SIGSTOP past the lease: the standby takes over; the old leader, resumed, must not land a
    decision (its lease check and, behind it, the fence of its announcement)."""
    cluster.configure(union=2)
    c1 = cluster.controller("c1")
    await c1.wait_http("/readiness")
    c2 = cluster.controller("c2")
    await c2.wait_http("/liveness")
    cluster.agent("n1", "union")
    cluster.agent("n2", "union")
    ids = set()
    for _ in range(2):
        asm = await cluster.tail.wait(
            lambda ev: ev.type == "instance.assembled" and ev.data.instance_id not in ids, within=120
        )
        ids.add(asm.data.instance_id)
    for iid in ids:
        await cluster.tail.wait(state_is(iid, "ACTIVE"), within=120)
    assert c1.proc is not None
    os.kill(c1.proc.pid, signal.SIGSTOP)
    try:
        took = await cluster.tail.wait(
            lambda ev: ev.type == "controller.leader_changed" and ev.data.leader_id == "c2", within=20
        )
        # Work for a leader while c1 is frozen: a fault that restarts one instance.
        node = cluster.tail.events(lambda ev: ev.type == "command.start")[0].data
        data = FaultReportedData(
            fault_id=new_id(),
            node_id=node.node_id,
            level="L3",
            code="EngineCoreDead",
            instance_id=node.instance_id,
        )
        await Publisher(cluster.nc.jetstream()).publish(operator_event(FaultReported, data))
        await cluster.tail.wait(
            lambda ev: ev.type == "command.start" and ev.source == "controller/c2", within=30
        )
    finally:
        os.kill(c1.proc.pid, signal.SIGCONT)
    await cluster.tail.wait(state_is(node.instance_id, "ACTIVE"), after=cluster.tail.index() - 1, within=60)
    await asyncio.sleep(3.0)  # the resumed c1 folds what it missed and would decide now
    status, body = await c1.get("/readiness")
    assert status == 503 and body["error"]["code"] == "standby"
    took_seq = next(r.seq for r in cluster.tail.records if r.event.id == took.id)
    late = [
        f"{r.seq} {r.event.type}"
        for r in cluster.tail.records
        if r.seq > took_seq and r.event.source == "controller/c1"
    ]
    assert late == [], f"the deposed leader wrote after the takeover: {late}"
    starts = cluster.tail.events(lambda ev: ev.type == "command.start")
    keys = [(s.data.instance_id, s.data.node_id, s.data.attempt, s.caused_by.id) for s in starts]
    assert len(keys) == len(set(keys)), f"a start decided twice: {keys}"
    per_attempt = [(s.data.instance_id, s.data.attempt, s.caused_by.id) for s in starts]
    assert len(per_attempt) == len(set(per_attempt))


async def test_controller_started_before_nats_waits_for_it(tmp_path: Path) -> None:
    """`motor up` may start the controller before NATS answers: it waits, then leads."""
    server = EmbeddedNats(tmp_path / "nats")
    await server.start()
    await server.kill()
    c1 = Controller(tmp_path, cluster_config(tmp_path / "cluster.json", union=1), server.url).start()
    try:
        await c1.wait_http("/liveness", within=60)
        await asyncio.sleep(3.0)
        assert c1.proc is not None and c1.proc.poll() is None, c1.output()[-3000:]
        await server.start()
        await c1.wait_http("/readiness", within=60)
    finally:
        c1.cleanup()
        await server.stop()
