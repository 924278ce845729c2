"""Controller healing with real node agents and builtin engines: crash, silence, fault ladder, alarms."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import pytest
from nats.js import JetStreamContext
from nats.js.errors import NoKeysError

from core.events import FaultReported, FaultReportedData, PrecisionAlarmRaised, PrecisionAlarmRaisedData
from core.ids import new_id
from streams.publisher import Publisher
from tests.integration.controller_harness import Cluster, assembled, engine_pid, operator_event, state_is


async def up(cluster: Cluster, nodes: dict[str, str], **cfg: Any) -> dict[str, int]:
    """Start a controller and agents; wait until every configured instance is ACTIVE; role -> id."""
    cluster.configure(**cfg)
    await cluster.controller("c1").wait_http("/readiness")
    for node, role in nodes.items():
        cluster.agent(node, role)
    want = sum(cfg.values())
    ids: dict[str, int] = {}
    for _ in range(want):
        asm = await cluster.tail.wait(
            # Generous: node agents are new Python processes, slow to start on a loaded machine.
            lambda ev: ev.type == "instance.assembled" and ev.data.instance_id not in ids.values(),
            within=120,
        )
        ids[asm.data.role.value if asm.data.role.value not in ids else f"{asm.data.role.value}2"] = (
            asm.data.instance_id
        )
    for iid in ids.values():
        await cluster.tail.wait(state_is(iid, "ACTIVE"), within=120)
    return ids


async def publish(cluster: Cluster, ev: Any) -> int:
    return await Publisher(cluster.nc.jetstream()).publish(ev)


def fault(node: str, level: str, instance_id: int, code: str = "CardUnhealthy") -> FaultReported:
    data = FaultReportedData(
        fault_id=new_id(), node_id=node, level=level, code=code, instance_id=instance_id, kind="hardware"
    )  # type: ignore[arg-type]
    return operator_event(FaultReported, data)  # type: ignore[no-any-return]


async def test_engine_crash_is_restarted_and_the_instance_is_active_again(cluster: Cluster) -> None:
    ids = await up(cluster, {"n1": "union"}, union=1)
    iid = ids["union"]
    pid = await engine_pid(cluster.agents["n1"])
    mark = cluster.tail.index()
    os.kill(pid, signal.SIGKILL)
    dead = await cluster.tail.wait(
        lambda ev: ev.type == "endpoint.status_changed" and ev.data.status == "DEAD", after=mark
    )
    iso = await cluster.tail.wait(state_is(iid, "ISOLATED"), after=mark, within=10)
    assert iso.caused_by.id == dead.id
    await cluster.tail.wait(state_is(iid, "RECOVERING"), after=mark, within=10)
    start = await cluster.tail.wait(lambda ev: ev.type == "command.start", after=mark, within=20)
    assert (start.data.node_id, start.data.instance_id, start.data.attempt) == ("n1", iid, 1)
    await cluster.tail.wait(state_is(iid, "ACTIVE"), after=mark, within=40)
    assert await engine_pid(cluster.agents["n1"]) != pid


async def test_silent_node_is_isolated_within_the_heartbeat_timeout_and_comes_back(cluster: Cluster) -> None:
    ids = await up(cluster, {"n1": "union"}, union=1)
    iid = ids["union"]
    agent = cluster.agents["n1"]
    assert agent.proc is not None
    mark = cluster.tail.index()
    os.kill(agent.proc.pid, signal.SIGSTOP)  # the agent freezes: no heartbeats, engine still up
    frozen = time.time()
    try:
        inactive = await cluster.tail.wait(state_is(iid, "INACTIVE"), after=mark, within=10)
    finally:
        os.kill(agent.proc.pid, signal.SIGCONT)
    assert "heartbeat" in inactive.data.reason
    assert inactive.ts - frozen <= 2.0 + 1.0  # heartbeat_timeout + 1 s
    back = await cluster.tail.wait(state_is(iid, "ACTIVE"), after=mark, within=10)
    assert "heartbeat" in back.data.reason


@pytest.mark.parametrize("level", ["L1", "L2"])
async def test_low_level_faults_are_recorded_without_action(cluster: Cluster, level: str) -> None:
    ids = await up(cluster, {"n1": "union"}, union=1)
    iid = ids["union"]
    mark = cluster.tail.index()
    await publish(cluster, fault("n1", level, iid, code="TransientError"))
    # Then an L3: the controller's first move must answer the L3, not the earlier fault.
    l3 = fault("n1", "L3", iid, code="EngineCoreDead")
    await publish(cluster, l3)
    first = await cluster.tail.wait(lambda ev: ev.source.startswith("controller"), after=mark, within=10)
    assert first.type == "instance.state_changed" and first.caused_by.id == l3.id
    _, body = await cluster.controllers["c1"].get("/v1/alarms")
    assert level in {f["level"] for f in body["faults"]}


@pytest.mark.parametrize("level", ["L3", "L4"])
async def test_restart_level_fault_restarts_the_engine_in_place(cluster: Cluster, level: str) -> None:
    ids = await up(cluster, {"n1": "union"}, union=1)
    iid = ids["union"]
    pid = await engine_pid(cluster.agents["n1"])
    mark = cluster.tail.index()
    f = fault("n1", level, iid, code="EngineCoreDead")
    await publish(cluster, f)
    iso = await cluster.tail.wait(state_is(iid, "ISOLATED"), after=mark, within=10)
    assert iso.caused_by.id == f.id
    await cluster.tail.wait(
        lambda ev: ev.type == "command.stop" and ev.data.node_id == "n1", after=mark, within=10
    )
    await cluster.tail.wait(
        lambda ev: ev.type == "command.start" and ev.data.node_id == "n1", after=mark, within=20
    )
    await cluster.tail.wait(state_is(iid, "ACTIVE"), after=mark, within=40)
    cleared = await cluster.tail.wait(lambda ev: ev.type == "fault.cleared", after=mark, within=10)
    assert cleared.data.fault_id == f.data.fault_id and cleared.source == "controller/c1"
    assert await engine_pid(cluster.agents["n1"]) != pid  # a new engine, same node


@pytest.mark.parametrize("level", ["L5", "L6"])
async def test_replace_level_fault_moves_the_instance_to_a_healthy_node(cluster: Cluster, level: str) -> None:
    ids = await up(cluster, {"n1": "union", "n2": "union"}, union=1)
    iid = ids["union"]
    asm = cluster.tail.events(assembled())[0]
    bad = asm.data.members[0].node_id
    spare = "n2" if bad == "n1" else "n1"
    mark = cluster.tail.index()
    f = fault(bad, level, iid)
    await publish(cluster, f)
    await cluster.tail.wait(state_is(iid, "ISOLATED"), after=mark, within=10)
    await cluster.tail.wait(
        lambda ev: ev.type == "command.stop" and ev.data.node_id == bad, after=mark, within=10
    )
    await cluster.tail.wait(state_is(iid, "TERMINATED"), after=mark, within=10)
    new = await cluster.tail.wait(assembled("union"), after=mark, within=20)
    assert [m.node_id for m in new.data.members] == [spare]
    await cluster.tail.wait(state_is(new.data.instance_id, "ACTIVE"), after=mark, within=40)
    _, body = await cluster.controllers["c1"].get("/v1/alarms")
    assert [(x["node_id"], x["level"]) for x in body["faults"]] == [(bad, level)]  # open until cleared


async def test_precision_alarm_isolates_the_pair_restarts_it_and_clears(cluster: Cluster) -> None:
    ids = await up(cluster, {"p1": "prefill", "d1": "decode"}, prefill=1, decode=1)
    d, p = ids["decode"], ids["prefill"]
    mark = cluster.tail.index()
    alarm = operator_event(
        PrecisionAlarmRaised, PrecisionAlarmRaisedData(alarm_id=new_id(), d_instance_id=d, p_instance_id=p)
    )
    await publish(cluster, alarm)
    for iid in (d, p):
        iso = await cluster.tail.wait(state_is(iid, "ISOLATED"), after=mark, within=10)
        assert iso.caused_by.id == alarm.id
    _, body = await cluster.controllers["c1"].get("/v1/alarms")
    assert [a["d_instance_id"] for a in body["precision_alarms"]] in ([d], [])  # open until the pair is back
    cleared = await cluster.tail.wait(lambda ev: ev.type == "precision.alarm_cleared", after=mark, within=60)
    assert (cleared.data.d_instance_id, cleared.data.p_instance_id, cleared.source) == (d, p, "controller/c1")
    states = {
        iid: [
            e.data.state for e in cluster.tail.events(lambda ev, i=iid: state_is(i, "ACTIVE")(ev), after=mark)
        ]
        for iid in (d, p)
    }
    trail = "\n".join(f"{r.seq} {r.event.type} {r.event.source}" for r in cluster.tail.records[mark:])
    assert states == {d: ["ACTIVE"], p: ["ACTIVE"]}, trail
    starts = cluster.tail.events(lambda ev: ev.type == "command.start", after=mark)
    assert sorted(s.data.node_id for s in starts) == ["d1", "p1"]


async def test_lost_log_tail_readopts_the_running_instance_under_its_id(
    cluster: Cluster, js: JetStreamContext
) -> None:
    """The log and the controller's checkpoint are lost while the engines keep running: a new
    controller re-adopts the instance under its old id, and the engine is never restarted."""
    from streams.definitions import CHECKPOINT_BUCKET, MOTOR_STREAM

    ids = await up(cluster, {"n1": "union"}, union=1)
    iid = ids["union"]
    pid = await engine_pid(cluster.agents["n1"])
    cluster.controllers["c1"].kill9()
    await js.purge_stream(MOTOR_STREAM)
    kv = await js.key_value(CHECKPOINT_BUCKET)
    with contextlib.suppress(NoKeysError):  # none saved yet is the same loss
        for key in await kv.keys():
            await kv.delete(key)
    mark = cluster.tail.index()
    cluster.controller("c2")
    # The agent notices its registration is gone and registers again with what it runs.
    reg = await cluster.tail.wait(
        lambda ev: ev.type == "node.registered" and ev.data.node_id == "n1", after=mark, within=30
    )
    assert (reg.data.instance_id, reg.data.running_endpoints) == (iid, (0,))
    asm = await cluster.tail.wait(assembled("union"), after=mark, within=60)
    assert asm.data.instance_id == iid and asm.caused_by.id == reg.id
    await cluster.tail.wait(state_is(iid, "ACTIVE"), after=mark, within=60)
    assert await engine_pid(cluster.agents["n1"]) == pid  # kept serving: never restarted
