"""An engine frozen for 30 s under client traffic (issue 20 item 1): SIGSTOP the union, the
prefill or the decode engine while it runs requests. It accepts connections and answers
nothing. No request may wait on it: those with no first byte are hedged on another path
within their endpoint's hedge delay, every exchange on it ends the moment its node agent's
health check calls it ABNORMAL, and a stream on it continues elsewhere as after a kill. So
no request takes longer than the health-check detection time plus one retry, none fails,
and every text equals an undisturbed run's (the load mixes streams and whole answers)."""

from __future__ import annotations

import signal
import time

import pytest

from core.events import Role
from tests.chaos import invariants as inv
from tests.chaos.faults import exited, signal_pid
from tests.chaos.harness import ChaosCluster
from tests.chaos.scenario import Scenario, hit_engine

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600)]

FREEZE_FOR = 30.0
# One more attempt elsewhere, and what a request had already run when the engine froze: a
# whole 40-token answer at the chaos engines' speed takes ~1 s on the loaded 2-core machine.
RETRY = 2.5
LIMIT = 5.0  # the bound with test-speed liveness


@pytest.mark.parametrize("role", [Role.UNION, Role.PREFILL, Role.DECODE], ids=lambda r: r.value)
async def test_no_request_waits_on_a_frozen_engine(chaos: ChaosCluster, role: Role) -> None:
    sc = await Scenario.begin(chaos, f"{role.value} engine SIGSTOP {FREEZE_FOR:g} s: no request waits on it")
    cfg = (
        chaos.cfg.union
        if role == Role.UNION
        else chaos.cfg.prefill
        if role == Role.PREFILL
        else chaos.cfg.decode
    )
    assert cfg is not None and cfg.health_check_config is not None
    hc = cfg.health_check_config
    detection = hc.interval + hc.timeout * hc.retry_attempts  # until its node agent says ABNORMAL
    limit = detection + RETRY
    assert limit <= LIMIT, f"the chaos cluster's health checks detect a hang in {detection:g} s: too slow"
    async with sc.traffic() as load:
        hit = await hit_engine(chaos, role, signal.SIGSTOP)
        sc.fault(hit.at)
        replaced = await exited(hit.pid, FREEZE_FOR)  # its node agent may replace it; else it thaws
        ended = time.time()
        signal_pid(hit.pid, signal.SIGCONT)
        what = "its node agent replaced it" if replaced else "it was thawed (SIGCONT)"
        print(f"   the frozen engine is gone after {ended - hit.at:.1f} s: {what}", flush=True)
        took = await sc.converge(ended)
    sc.check(inv.fault_hit(hit.in_flight, hit.engine.label))
    entries = await sc.common(fault_ended=ended, took=took)
    sc.check(inv.latency_bound(load.outcomes, limit, origin=hit.at))
    await sc.explain(entries, hit.at, hit.engine.instance_id)
    sc.finish()
