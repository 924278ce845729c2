"""MOTOR ages out under a running cluster (issue 24 item 3), then each coordinator replica is
restarted and must serve from what the log still holds.

The cluster runs with a one-minute `max_age`. Once everything from its start has aged out
(the assemblies, the starts, the first READYs), a fold of MOTOR must still show every running
instance ACTIVE: the controller restated its instances, the node agents their registrations and
statuses. Then coordinator-1 is SIGKILLed and, once the supervisor restarted it, coordinator-2:
from then on only replicas that folded the aged log alone answer the port. Before the fix they
knew no instance and answered 503 while every engine ran.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.chaos.conftest import ClusterPool
from tests.chaos.faults import kill_child
from tests.chaos.fleet import engines, pid_on
from tests.chaos.harness import ChaosCluster
from tests.chaos.invariants import Check, engines_kept
from tests.chaos.scenario import Scenario, until_restarted
from tests.chaos.test_lost_log import log_holds_the_truth

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(900)]

MAX_AGE = 60.0  # seconds MOTOR keeps an event in this scenario


@pytest.fixture
async def aging(pool: ClusterPool) -> ChaosCluster:
    """A cluster whose MOTOR keeps events for a minute (two coordinator replicas)."""
    return await pool.get(coordinators=2, max_age=MAX_AGE)


async def _aged_past(cc: ChaosCluster, seq: int, within: float) -> float:
    """Wait until MOTOR's first sequence is past `seq` (all up to it aged out); seconds it took."""
    t0 = time.monotonic()
    while True:
        info = await cc.admin.jetstream().stream_info("MOTOR")
        if info.state.first_seq > seq:
            return time.monotonic() - t0
        assert time.monotonic() - t0 < within, f"MOTOR still starts at {info.state.first_seq} (<= {seq})"
        await asyncio.sleep(1.0)  # the server's expiry runs on its timer: nothing to await


async def _listening_again(cc: ChaosCluster, name: str, within: float) -> bool:
    """Whether the replica's restart got as far as taking connections (its log says so): the
    next replica is killed only then, or nothing would answer the port for a moment."""
    path = cc.cluster.logs / f"{name}.log"
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        text = path.read_text(errors="replace") if path.exists() else ""
        if "coordinator listening on" in text.rpartition(f"starting {name}")[2]:
            return True
        await asyncio.sleep(0.2)  # a log file: nothing to await
    return False


async def test_age_out_then_coordinators_restarted(aging: ChaosCluster) -> None:
    cc = aging
    state = await cc.fold()
    assert state is not None
    pids = {e.port: pid_on(e.port) for e in engines(state)}
    up_to = await cc.last_seq()
    names = cc.cluster.coordinator_names()
    sc = await Scenario.begin(
        cc, f"MOTOR max_age {MAX_AGE:g} s: the cluster's start ages out, then {' and '.join(names)} SIGKILL"
    )
    async with sc.traffic(retry_connection_errors=True):
        took = await _aged_past(cc, up_to, 3 * MAX_AGE)
        print(f"   the log up to seq {up_to} aged out after {took:.0f} s", flush=True)
        aged = time.time()
        await log_holds_the_truth(sc, pids, aged)
        first = 0.0
        for name in names:
            before = cc.cluster.restarts(name)
            t = sc.fault(kill_child(cc.cluster, name))
            first = first or t
            back = await until_restarted(cc, name, before) and await _listening_again(cc, name, 60.0)
            sc.check(Check(f"{name} restarted", back, "listening again" if back else "not listening again"))
            converged = await sc.converge(t, floor=5.0)
    # The last replica's in-flight requests (and a stale keep-alive to it) may fail once.
    entries = await sc.common(fault_ended=t, killed=tuple(names), reconnect_until=t + 3.0, took=converged)
    sc.check(engines_kept(pids, {p: pid_on(p) for p in pids}, entries, first))
    sc.finish()
