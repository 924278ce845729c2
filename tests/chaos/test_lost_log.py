"""The log loses its tail under a running cluster (MOTOR purged, or deleted and created again).
The processes carry on from memory; node agents must re-assert what they run so that a fold of
what MOTOR holds shows every running instance ACTIVE again within 60 s."""

from __future__ import annotations

import time

import pytest

from core.state import ClusterState
from tests.chaos import invariants as inv
from tests.chaos.faults import purge_motor, recreate_motor
from tests.chaos.fleet import converged, engines, pid_on
from tests.chaos.harness import ChaosCluster
from tests.chaos.scenario import Scenario

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600)]

LOG_TRUTH_WITHIN = 60.0


@pytest.mark.parametrize("how", ["purge", "delete-and-recreate"])
async def test_log_tail_lost(chaos: ChaosCluster, how: str) -> None:
    sc = await Scenario.begin(chaos, f"log tail lost: MOTOR {how} under the running cluster")
    state = await chaos.fold()
    assert state is not None
    pids = {e.port: pid_on(e.port) for e in engines(state)}

    def holds_the_truth(s: ClusterState) -> bool:
        return converged(s) and {e.port for e in engines(s)} >= set(pids)

    async with sc.traffic():
        nc = chaos.admin
        if how == "purge":
            t = sc.fault(await purge_motor(nc))
        else:
            t = sc.fault(await recreate_motor(nc, chaos.cfg.nats, chaos.cfg.controller.lease_ttl))
            sc.seq0 = 0  # the stream starts again from 1: all of it is this scenario's
        try:
            await chaos.wait_until(
                "a fold of MOTOR with every running instance ACTIVE", holds_the_truth, LOG_TRUTH_WITHIN
            )
            truth: float | None = time.time() - t
        except AssertionError:
            truth = None
        took = await sc.converge(t)
    sc.check(inv.reconverged(truth, LOG_TRUTH_WITHIN, "a fold of MOTOR shows every running instance ACTIVE"))
    entries = await sc.common(fault_ended=t, took=took)
    sc.check(inv.engines_kept(pids, {p: pid_on(p) for p in pids}, entries, t))
    sc.finish()
