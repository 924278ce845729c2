"""Motor's own processes under client traffic: node agent killed or frozen, controller leader,
standby or both killed, one of two coordinator replicas killed or frozen. `motor up`'s
supervisor brings back what was killed, and kills and brings back a replica that stopped
answering; clients must not notice."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.chaos import invariants as inv
from tests.chaos.faults import child_pid, frozen, kill_child, sleep_until
from tests.chaos.fleet import probe, replica_served
from tests.chaos.harness import ChaosCluster
from tests.chaos.scenario import CONVERGE_WITHIN, FAILOVER_WITHIN, Scenario, until_restarted

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600)]


async def test_node_agent_killed(chaos: ChaosCluster) -> None:
    name = "nodeagent-decode-0"
    sc = await Scenario.begin(chaos, f"{name} SIGKILL")
    before = chaos.cluster.restarts(name)
    async with sc.traffic():
        t = sc.fault(kill_child(chaos.cluster, name))
        await until_restarted(chaos, name, before)
        took = await sc.converge(t, floor=5.0)
    await sc.common(fault_ended=t, killed=(name,), took=took)
    sc.finish()


async def test_node_agent_frozen_past_heartbeat_timeout(chaos: ChaosCluster) -> None:
    name = "nodeagent-decode-0"
    silent = chaos.cfg.controller.heartbeat_timeout + 3.0
    sc = await Scenario.begin(chaos, f"{name} SIGSTOP for {silent:g} s (heartbeat_timeout + 3 s)")
    pid = child_pid(chaos.cluster, name)
    assert pid is not None
    async with sc.traffic():
        async with frozen(pid) as freeze:
            sc.fault(freeze.at)
            await asyncio.sleep(silent)
        ended = time.time()
        took = await sc.converge(ended)
    await sc.common(fault_ended=ended, took=took)
    sc.finish()


async def test_controller_leader_killed(chaos: ChaosCluster) -> None:
    leader = await chaos.leader()
    assert leader is not None, "no controller leads before the fault"
    standby = next(n for n in chaos.cluster.controller_names() if n != leader)
    sc = await Scenario.begin(chaos, f"controller leader ({leader}) SIGKILL")
    before = chaos.cluster.restarts(leader)
    async with sc.traffic():
        t = sc.fault(kill_child(chaos.cluster, leader))
        decided = await chaos.leader_changed(sc.seq0, t, within=30)
        await until_restarted(chaos, leader, before)
        took = await sc.converge(t)
    # The standby should win; the killed leader, restarted by the supervisor, may race it for
    # the lapsed lease. Either way decisions resume: what counts is how soon.
    who = decided[0] if decided is not None else standby.removeprefix("controller-")
    role = "the standby" if who == standby.removeprefix("controller-") else "the restarted leader"
    sc.check(inv.failover(t, decided[1] if decided else None, FAILOVER_WITHIN, f"{role} {who}"))
    await sc.common(fault_ended=t, killed=(leader,), took=took)
    sc.finish()


async def test_controller_standby_killed(chaos: ChaosCluster) -> None:
    leader = await chaos.leader()
    assert leader is not None, "no controller leads before the fault"
    standby = next(n for n in chaos.cluster.controller_names() if n != leader)
    sc = await Scenario.begin(chaos, f"controller standby ({standby}) SIGKILL")
    before = chaos.cluster.restarts(standby)
    async with sc.traffic():
        t = sc.fault(kill_child(chaos.cluster, standby))
        await until_restarted(chaos, standby, before)
        took = await sc.converge(t, floor=5.0)
    changed = await chaos.leader_changed(sc.seq0, t, within=0.1)
    still = await chaos.leader()
    sc.check(
        inv.Check(
            "9 leader failover",
            changed is None and still == leader,
            f"{leader} still leads, no leader change"
            if changed is None and still == leader
            else f"the standby's death moved the lease: leader now {still}, change {changed}",
        )
    )
    await sc.common(fault_ended=t, killed=(standby,), took=took)
    sc.finish()


async def test_both_controllers_killed_and_back(chaos: ChaosCluster) -> None:
    names = chaos.cluster.controller_names()
    sc = await Scenario.begin(chaos, "both controllers SIGKILL, back through the supervisor")
    before = {n: chaos.cluster.restarts(n) for n in names}
    async with sc.traffic():
        t = sc.fault(time.time())
        for n in names:
            kill_child(chaos.cluster, n)
        for n in names:
            await until_restarted(chaos, n, before[n])
        decided = await chaos.leader_changed(sc.seq0, t, within=CONVERGE_WITHIN)
        took = await sc.converge(t)
    sc.check(inv.failover(t, decided[1] if decided else None, CONVERGE_WITHIN, "a restarted controller"))
    await sc.common(fault_ended=t, killed=tuple(names), took=took)
    sc.finish()


async def test_one_coordinator_replica_killed(chaos: ChaosCluster) -> None:
    names = chaos.cluster.coordinator_names()
    assert len(names) == 2, "the shared chaos cluster runs two coordinator replicas"
    victim = names[0]
    sc = await Scenario.begin(chaos, f"coordinator replica {victim} SIGKILL (of {len(names)} on one port)")
    before = chaos.cluster.restarts(victim)
    async with sc.traffic(retry_connection_errors=True):
        t = sc.fault(kill_child(chaos.cluster, victim))
        await until_restarted(chaos, victim, before)
        took = await sc.converge(t, floor=5.0)
    # Its own in-flight requests (and a client's stale keep-alive to it) may fail once; the
    # client's retry lands on the surviving replica.
    await sc.common(fault_ended=t, killed=(victim,), reconnect_until=t + 3.0, took=took)
    sc.finish()


REPLICA_FROZEN_FOR = 60.0
SLOWEST_REQUEST = 5.0  # issue 24: no request slower than this while a replica is frozen


async def test_one_coordinator_replica_frozen_60s(chaos: ChaosCluster) -> None:
    """Issue 24 item 5: a SIGSTOPped replica keeps its socket in the shared port, so the
    kernel keeps handing it connections; the supervisor's liveness probe on the replica's own
    socket must take it out (kill -9) within seconds, a fresh replica must take its place, and
    the SIGCONT at the end of the freeze must find nothing to wake."""
    names = chaos.cluster.coordinator_names()
    assert len(names) == 2, "the shared chaos cluster runs two coordinator replicas"
    victim = names[1]
    rule = chaos.cluster.liveness
    sc = await Scenario.begin(
        chaos, f"coordinator replica {victim} SIGSTOP for {REPLICA_FROZEN_FOR:g} s (of 2 on one port)"
    )
    before = chaos.cluster.restarts(victim)
    pid = child_pid(chaos.cluster, victim)
    assert pid is not None
    sock = str(chaos.cluster.probe_socket(victim))
    async with sc.traffic(retry_connection_errors=True):
        async with frozen(pid) as freeze:
            t = sc.fault(freeze.at)
            await until_restarted(chaos, victim, before, within=30)
            killed_at = next(
                (
                    n.at
                    for n in chaos.cluster.supervisor.notices
                    if n.name == victim and n.kind == "unresponsive" and n.at >= t
                ),
                None,
            )
            took = await sc.converge(t, floor=5.0)
            await sleep_until(t + REPLICA_FROZEN_FOR)
        print(f"   SIGCONT to pid {pid}: {'it was still there' if freeze.continued else 'gone'}", flush=True)
        await asyncio.sleep(3.0)  # traffic after the SIGCONT: whatever it woke must harm nothing
        # The load's clients keep their connections (to the surviving replica, since the kill);
        # fresh ones are spread over both replicas by the kernel, the new one included.
        await probe(chaos.base_url, sc.load, n=16)
        pid_after = child_pid(chaos.cluster, victim)
        served_after = await replica_served(sock)
    # A request the frozen replica had taken fails once (its connection reset at the kill);
    # the client's retry lands on the other replica.
    reset_until = (killed_at if killed_at is not None else t) + 3.0
    await sc.common(fault_ended=t, killed=(victim,), reconnect_until=reset_until, took=took)
    assert sc.load is not None
    sc.check(inv.latency_bound(sc.load.outcomes, SLOWEST_REQUEST, origin=t))
    sc.check(
        inv.replica_replaced(
            frozen_at=t,
            killed_at=killed_at,
            within=rule.kill_within,
            pid_before=pid,
            pid_after=pid_after,
            served_after=served_after,
            restarts=chaos.cluster.restarts(victim) - before,
            continued=freeze.continued,
        )
    )
    sc.finish()
