"""Leader failover, guarded appends and checkpoint + tail start-up, on a real nats-server."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from nats.aio.client import Client
from nats.js import JetStreamContext

from controller.appender import Appender, Outcome
from controller.fold import Fold
from controller.metrics import ControllerMetrics
from controller.rule_context import Cause, Ctx, Decision
from controller.service import ControllerService
from core.config import config_from_dict
from core.events import (
    EndpointSpec,
    FaultReported,
    FaultReportedData,
    InstanceState,
    LeaderChanged,
    LeaderChangedData,
    NodeRegistered,
    NodeRegisteredData,
    Role,
)
from core.ids import new_id
from core.reducer import apply
from core.state import ClusterState, state_to_dict
from streams.definitions import MOTOR_STREAM
from streams.jetstream import JetStreamLog
from streams.log import Range
from streams.publisher import Publisher
from streams.reader import read_range
from streams.server import EmbeddedNats
from tests.integration.checkpoints import load_checkpoint
from tests.integration.controller_harness import CONTROLLER, Cluster, operator_event, state_is


async def test_leader_killed_mid_scenario_standby_decides_within_3s_without_repeating_starts(
    cluster: Cluster,
) -> None:
    cluster.configure(union=2)
    c1 = cluster.controller("c1")
    await c1.wait_http("/readiness")
    c2 = cluster.controller("c2")
    await c2.wait_http("/liveness")
    cluster.agent("n1", "union")
    cluster.agent("n2", "union")
    first = await cluster.tail.wait(lambda ev: ev.type == "command.start", within=40)
    assert first.source == "controller/c1"
    c1.kill9()
    killed = time.time()
    # Something that needs a decision right away: a restart-level fault on the started node.
    f = operator_event(
        FaultReported,
        FaultReportedData(
            fault_id=new_id(),
            node_id=first.data.node_id,
            level="L3",
            code="EngineCoreDead",
            instance_id=first.data.instance_id,
        ),
    )
    await Publisher(cluster.nc.jetstream()).publish(f)
    leader = await cluster.tail.wait(
        lambda ev: ev.type == "controller.leader_changed" and ev.data.leader_id == "c2", within=10
    )
    assert leader.data.previous == "c1" and leader.data.term == 2
    iso = await cluster.tail.wait(
        lambda ev: (
            ev.type == "instance.state_changed" and ev.caused_by is not None and ev.caused_by.id == f.id
        ),
        within=10,
    )
    assert iso.source == "controller/c2"
    print(f"standby took over {leader.ts - killed:.2f}s and decided {iso.ts - killed:.2f}s after the kill")
    assert iso.ts - killed <= 3.0, f"standby decided {iso.ts - killed:.2f}s after the kill"
    for iid in {
        first.data.instance_id,
        *(e.data.instance_id for e in cluster.tail.events(lambda ev: ev.type == "instance.assembled")),
    }:
        await cluster.tail.wait(state_is(iid, "ACTIVE"), within=60)
    starts = cluster.tail.events(lambda ev: ev.type == "command.start")
    ids = [s.data.command_id for s in starts]
    assert len(ids) == len(set(ids)), "a start command was appended twice"
    keys = [(s.data.node_id, s.data.instance_id, s.caused_by.id, s.data.attempt) for s in starts]
    assert len(keys) == len(set(keys)), f"the same start was decided twice: {keys}"
    # n1 and n2 each: one first start, and one restart for the faulted node.
    assert len(starts) == 3, [(s.source, s.data.node_id, s.caused_by.id) for s in starts]
    status, body = await c2.get("/readiness")
    assert status == 200 and body["term"] == 2


# --------------------------------------------------------------------------- in-process


def cfg(**controller: Any) -> Any:
    return config_from_dict({"union": {"instances": 3}, "controller": {**CONTROLLER, **controller}})


def registration(node: str, ip: str) -> NodeRegistered:
    ep = EndpointSpec(id=0, ip=ip, business_port=9100, mgmt_port=9100)
    data = NodeRegisteredData(
        node_id=node,
        job_name="motor",
        pod_ip=ip,
        role=Role.UNION,
        engine_type="builtin",
        model="motor-sim",
        endpoints=(ep,),
    )
    return NodeRegistered(id=new_id(), ts=time.time(), source=f"test/{node}", data=data)


async def fold_all(nc: Client, until_seq: int) -> ClusterState:
    s = ClusterState()
    async for rec in read_range(nc, span=Range(until_seq=until_seq)):
        s = apply(s, rec.event, rec.seq)
    return s


@contextlib.asynccontextmanager
async def running(service: ControllerService) -> AsyncIterator[ControllerService]:
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        await asyncio.wait_for(service.caught_up.wait(), 30)
        yield service
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def wait_for(pred: Any, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not pred():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)  # in-process state, nothing to await on


async def test_checkpoint_then_tail_gives_the_state_of_a_full_replay(
    nats_server: EmbeddedNats, nc: Client, js: JetStreamContext
) -> None:
    pub = Publisher(js)
    config = cfg(checkpoint_every=3)
    for i in range(3):
        await pub.publish(registration(f"n{i}", f"10.1.0.{i}"))
    async with running(ControllerService(config, controller_id="c1", nats_urls=[nats_server.url])) as svc:
        await wait_for(lambda: svc.leader and len(svc.state.instances) == 3 and svc.checkpoint_seq > 0)
        saved = svc.checkpoint_seq
    cp = await load_checkpoint(JetStreamLog.of(js), "controller")
    assert cp is not None and cp.last_seq >= saved  # a later one may have landed before the stop
    saved = cp.last_seq
    await pub.publish(registration("late", "10.1.0.9"))  # the tail
    svc2 = ControllerService(config, controller_id="c2", nats_urls=[nats_server.url])
    async with running(svc2):
        assert not svc2.fold.complete  # started from the checkpoint, not from seq 1
        await wait_for(lambda: "late" in svc2.state.nodes and svc2.leader)
        snapshot = svc2.state
        assert snapshot.nodes["late"].registered_seq > saved
        want = state_to_dict(await fold_all(nc, snapshot.last_seq))
        got = state_to_dict(snapshot)
        for s in (want, got):
            s.pop("events_applied")  # the checkpoint counted events we did not replay
        assert got == want


async def test_a_checkpoint_ahead_of_the_log_is_set_aside_for_the_log(
    nats_server: EmbeddedNats, nc: Client, js: JetStreamContext
) -> None:
    """The log lost its tail after the checkpoint (its sequences will be reused): the
    checkpoint tells of a past the log no longer has, so the controller replays the log."""
    from streams.checkpoint import save_checkpoint
    from streams.definitions import CHECKPOINT_BUCKET, MOTOR_STREAM
    from streams.reader import stream_last_seq

    pub = Publisher(js)
    await pub.publish(registration("real", "10.3.0.1"))
    last = await stream_last_seq(nc, MOTOR_STREAM)
    ghost = apply(ClusterState(), registration("ghost", "10.3.0.9"), last + 1_000_000)
    await save_checkpoint(JetStreamLog.of(js), "controller", ghost)
    try:
        async with running(ControllerService(cfg(), controller_id="c1", nats_urls=[nats_server.url])) as svc:
            assert svc.fold.complete  # folded from the first sequence, not from the checkpoint
            assert "real" in svc.state.nodes and "ghost" not in svc.state.nodes
    finally:
        kv = await js.key_value(CHECKPOINT_BUCKET)
        cp = await load_checkpoint(JetStreamLog.of(js), "controller")
        if cp is not None and "ghost" in cp.nodes:
            await kv.delete("controller")


async def test_a_deposed_leaders_late_write_is_fenced_even_on_a_subject_nobody_else_wrote(
    nats_server: EmbeddedNats, nc: Client, js: JetStreamContext
) -> None:
    pub = Publisher(js)
    await pub.publish(registration("n1", "10.2.0.1"))
    config = cfg()
    async with running(ControllerService(config, controller_id="old", nats_urls=[nats_server.url])) as svc:
        await wait_for(lambda: 1 in svc.state.instances and svc.leader)
        stale = svc.state  # what the deposed leader decided on
        assert svc._appender is not None and svc._appender.fence is not None
        fence = svc._appender.fence
    inst = stale.instances[1]
    node = stale.nodes["n1"]
    appender = Appender(JetStreamLog.of(js), Fold(stale), ControllerMetrics("old"))
    appender.fence = fence
    old = Ctx.build(stale, config, time.time(), source="controller/old")
    # Still the last to have announced itself: its write lands.
    before = old.stop(node, 1, Cause(0, "a", "before the newer leader"), tag="before")
    assert await appender.append([before], lambda: True) is Outcome.DONE
    # A newer leader announces itself and moves the instance on.
    newer = LeaderChanged(
        id=new_id(), ts=time.time(), source="controller/new", data=LeaderChangedData(leader_id="new", term=9)
    )
    await pub.publish(newer)
    ctx_new = Ctx.build(stale, config, time.time(), source="controller/new")
    await pub.publish(ctx_new.state_change(inst, InstanceState.ISOLATED, Cause(0, "x", "newer leader")).event)
    # The deposed leader's late writes: on the instance the newer leader wrote, and on a
    # command subject nobody wrote since (a per-subject guard would let that one through).
    late_state: Decision = old.state_change(inst, InstanceState.TERMINATED, Cause(0, "y", "late write"))
    late_stop: Decision = old.stop(node, 1, Cause(0, "z", "late write"), tag="late")
    for late in (late_stop, late_state):
        assert await appender.append([late], lambda: True) is Outcome.FENCED
    assert appender.metrics.registry.get_sample_value("motor_controller_appends_fenced_total") == 2
    ids = [rec.event.id async for rec in read_range(nc)]
    assert before.id in ids and late_stop.id not in ids and late_state.id not in ids
    # And a controller whose lease lapsed does not even try.
    assert await appender.append([late_stop], lambda: False) is Outcome.STOPPED


async def test_a_lease_renewed_late_resumes_the_same_reign_without_a_new_announcement(
    nats_server: EmbeddedNats, nc: Client, js: JetStreamContext
) -> None:
    """A loaded machine makes a renewal late: the leader stops deciding for that moment, then
    leads on under the same fence; it does not flap through new terms (and nobody else took over)."""
    pub = Publisher(js)
    await pub.publish(registration("n1", "10.4.0.1"))
    async with running(ControllerService(cfg(), controller_id="c1", nats_urls=[nats_server.url])) as svc:
        await wait_for(lambda: svc.leader and 1 in svc.state.instances)
        lead = svc.leadership
        assert lead is not None
        fence = svc._appender.fence if svc._appender else None
        renew = lead.lease.renew
        slow_until = time.monotonic() + 2.5  # longer than the lease (1.5 s): it lapses on the server too

        async def late() -> bool:
            if time.monotonic() < slow_until:
                return False  # what a renewal that timed out on a busy machine returns
            return await renew()

        lead.lease.renew = late  # type: ignore[method-assign]
        await wait_for(lambda: not svc.leader, within=5)
        await wait_for(lambda: svc.leader, within=10)
        assert svc._appender is not None and svc._appender.fence == fence
    leaders = [rec.event async for rec in read_range(nc) if rec.event.type == "controller.leader_changed"]
    assert [(e.data.leader_id, e.data.term) for e in leaders] == [("c1", 1)]


async def test_a_batch_of_decisions_goes_out_before_the_first_ack(nc: Client, js: JetStreamContext) -> None:
    # Each decision used to wait for its ack before the next went out: a cold start of 1000
    # nodes spent most of its assembly there (`just bench fleet`). No stream and a listener
    # that never acks: one at a time, the second would go out only after the first timed out.
    state = ClusterState()
    for i in range(10):
        state = apply(state, registration(f"n{i}", f"10.3.0.{i + 1}"), i + 1)
    ctx = Ctx.build(state, cfg(), time.time(), source="controller/t")
    decisions = [ctx.stop(state.nodes[f"n{i}"], None, Cause(i + 1, "r", "test")) for i in range(10)]
    appender = Appender(JetStreamLog.of(js), Fold(state), ControllerMetrics("t"))
    appender.fence = 1
    appender.publisher.ack_timeout = 3.0
    await js.delete_stream(MOTOR_STREAM)
    got: list[str] = []

    async def listen(msg: Any) -> None:
        got.append(msg.subject)

    sub = await nc.subscribe("motor.cmd.>", cb=listen)
    try:
        task = asyncio.create_task(appender.append(decisions, lambda: True))
        deadline = time.monotonic() + 2
        while len(got) < 10:
            assert time.monotonic() < deadline, f"only {len(got)} of 10 decisions sent before any ack"
            await asyncio.sleep(0.02)  # the listener runs on the client's read loop
        assert await task is Outcome.STOPPED and appender.landed == 0
        assert got == [f"motor.cmd.n{i}.stop" for i in range(10)]  # in the order decided
    finally:
        await sub.unsubscribe()
