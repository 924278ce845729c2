"""NATS away under client traffic: kill -9 for 15 s and for 90 s (then started again on the
same store), and frozen (SIGSTOP) for 15 s. The data path does not use NATS: clients must not
notice; no controller may exit; nothing may be judged by the silence; engines keep running."""

from __future__ import annotations

import asyncio

import pytest

from tests.chaos import invariants as inv
from tests.chaos.faults import nats_down
from tests.chaos.fleet import engines, pid_on
from tests.chaos.harness import ChaosCluster
from tests.chaos.scenario import Scenario

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600)]


@pytest.mark.parametrize(
    ("seconds", "freeze"),
    [(15.0, False), (90.0, False), (15.0, True)],
    ids=["down-15s", "down-90s", "frozen-15s"],
)
async def test_nats_outage(chaos: ChaosCluster, seconds: float, freeze: bool) -> None:
    how = "SIGSTOP" if freeze else "kill -9, restarted on the same store"
    sc = await Scenario.begin(chaos, f"NATS away {seconds:g} s ({how})")
    state = await chaos.fold()
    assert state is not None
    pids = {e.port: pid_on(e.port) for e in engines(state)}
    async with sc.traffic():
        async with nats_down(chaos.cluster, freeze=freeze) as outage:
            sc.fault(outage.began)
            await asyncio.sleep(seconds)
        took = await sc.converge(outage.ended)
    entries = await sc.common(fault_ended=outage.ended, nats_trouble=True, took=took)
    sc.check(inv.nothing_judged_by_outage(entries, outage.began))
    sc.check(inv.engines_kept(pids, {p: pid_on(p) for p in pids}, entries, outage.began))
    sc.finish()
