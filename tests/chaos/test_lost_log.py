"""The log loses its tail under a running cluster (MOTOR purged, or deleted and created again).
The processes carry on from memory; node agents must re-assert what they run so that a fold of
what MOTOR holds shows every running instance ACTIVE again within 60 s."""

from __future__ import annotations

import asyncio
import time

import pytest

from core.events import StopCommand, StopCommandData
from core.ids import new_id
from core.state import ClusterState
from streams.publisher import Publisher
from tests.chaos import invariants as inv
from tests.chaos.faults import kill_child, purge_motor, recreate_motor
from tests.chaos.fleet import converged, engines, pid_on
from tests.chaos.harness import ChaosCluster
from tests.chaos.scenario import Scenario, until_restarted

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600)]

LOG_TRUTH_WITHIN = 60.0
UNUSED_INSTANCE = 10_000  # no node runs it: a stop for it changes nothing but the node's term


@pytest.mark.parametrize("how", ["purge", "delete-and-recreate"])
async def test_log_tail_lost(chaos: ChaosCluster, how: str) -> None:
    sc = await Scenario.begin(chaos, f"log tail lost: MOTOR {how} under the running cluster")
    state = await chaos.fold()
    assert state is not None
    pids = {e.port: pid_on(e.port) for e in engines(state)}

    async with sc.traffic():
        nc = chaos.admin
        if how == "purge":
            t = sc.fault(await purge_motor(nc))
        else:
            t = sc.fault(await recreate_motor(nc, chaos.cfg.nats, chaos.cfg.controller.lease_ttl))
            sc.seq0 = 0  # the stream starts again from 1: all of it is this scenario's
        await log_holds_the_truth(sc, pids, t)
        took = await sc.converge(t)
    entries = await sc.common(fault_ended=t, took=took)
    sc.check(inv.engines_kept(pids, {p: pid_on(p) for p in pids}, entries, t))
    sc.finish()


async def test_log_tail_lost_then_both_controllers_killed(chaos: ChaosCluster) -> None:
    """After a purge both controllers die; the supervisor's restarts know only the new log, which
    names no leader, so their first reign is term 1 while the node agents obeyed a later one.
    Their refusals (`stale_term`, `seen_term`) must make the leader announce past that term and
    send the same starts again, not count as failed starts and fail every instance over."""
    state = await chaos.fold()
    assert state is not None
    pids = {e.port: pid_on(e.port) for e in engines(state)}
    # Each node agent obeys a reign past any the controllers folded, as leader kills before a
    # purge leave behind: a stop for an instance no node runs does nothing but teach the term.
    term = (state.leader.term if state.leader else 0) + 3
    seq0 = await chaos.last_seq()
    cids = set()
    for node in sorted(state.nodes):
        data = StopCommandData(command_id=new_id(), node_id=node, instance_id=UNUSED_INSTANCE, term=term)
        cids.add(data.command_id)
        await Publisher(chaos.admin.jetstream()).publish(
            StopCommand(id=new_id(), ts=time.time(), source="chaos/earlier-reign", data=data)
        )
    await _until_applied(chaos, seq0, cids)
    names = chaos.cluster.controller_names()
    sc = await Scenario.begin(
        chaos, f"MOTOR purged, then both controllers SIGKILL (nodes obeyed term {term})"
    )
    before = {n: chaos.cluster.restarts(n) for n in names}

    async with sc.traffic():
        t = sc.fault(await purge_motor(chaos.admin))
        for n in names:
            kill_child(chaos.cluster, n)
        for n in names:
            await until_restarted(chaos, n, before[n])
        await log_holds_the_truth(sc, pids, t)
        took = await sc.converge(t)
    entries = await sc.common(fault_ended=t, killed=tuple(names), took=took)
    reigns = [e.data.get("term", 0) for e in entries if e.type == "controller.leader_changed" and e.ts >= t]
    exhausted = [e for e in entries if e.type == "fault.reported" and e.ts >= t]
    sc.check(
        inv.Check(
            "6 no duplicated decision",
            bool(reigns) and max(reigns) > term and not exhausted,
            f"reigns after the purge: {reigns} (nodes obeyed {term}); faults raised: "
            f"{[e.data.get('code') for e in exhausted]}",
        )
    )
    sc.check(inv.engines_kept(pids, {p: pid_on(p) for p in pids}, entries, t))
    sc.finish()


async def _until_applied(chaos: ChaosCluster, since_seq: int, cids: set[str], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while True:
        done = {
            e.data.get("command_id")
            for e in await chaos.entries(since_seq + 1)
            if e.type == "command.applied"
        }
        if cids <= done:
            return
        assert time.monotonic() < deadline, f"commands not applied within {within}s: {cids - done}"
        await asyncio.sleep(0.2)  # re-reading the log: nothing to await


async def log_holds_the_truth(sc: Scenario, pids: dict[int, int | None], since: float) -> None:
    """Invariant 8: a fold of what MOTOR holds shows every running instance ACTIVE again."""

    def holds(s: ClusterState) -> bool:
        return converged(s) and {e.port for e in engines(s)} >= set(pids)

    try:
        await sc.cc.wait_until("a fold of MOTOR with every running instance ACTIVE", holds, LOG_TRUTH_WITHIN)
        truth: float | None = time.time() - since
    except AssertionError:
        truth = None
    sc.check(inv.reconverged(truth, LOG_TRUTH_WITHIN, "a fold of MOTOR shows every running instance ACTIVE"))
