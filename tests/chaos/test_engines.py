"""Engine faults under client traffic: kill -9 mid-stream (union, prefill, decode), a hang
(SIGSTOP), and two kills inside one breaker backoff."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from core.events import Role
from tests.chaos import invariants as inv
from tests.chaos.faults import exited, signal_pid
from tests.chaos.harness import FIRST_TOKEN_TIMEOUT, ChaosCluster
from tests.chaos.scenario import Scenario, hit_engine, resumed

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600)]

HANG_FOR = 15.0  # longer than the health-check window: the hung engine must leave routing


@pytest.mark.parametrize("role", [Role.UNION, Role.PREFILL, Role.DECODE], ids=lambda r: r.value)
async def test_engine_killed_mid_stream(chaos: ChaosCluster, role: Role) -> None:
    sc = await Scenario.begin(chaos, f"{role.value} engine SIGKILL mid-stream")
    async with sc.traffic():
        hit = await hit_engine(chaos, role)
        sc.fault(hit.at)
        took = await sc.converge(hit.at)
    sc.check(inv.fault_hit(hit.in_flight, hit.engine.label))
    entries = await sc.common(fault_ended=hit.at, took=took)
    sc.check(resumed([hit], entries))
    await sc.explain(entries, hit.at, hit.engine.instance_id)
    sc.finish()


async def test_decode_engine_hangs(chaos: ChaosCluster) -> None:
    sc = await Scenario.begin(chaos, "decode engine SIGSTOP (accepts, never answers)")
    hc = chaos.cfg.decode.health_check_config if chaos.cfg.decode else None
    assert hc is not None
    # Time for the node agent to call it unhealthy and for routing to hear of it.
    window = hc.interval + hc.timeout * (hc.retry_attempts + 1) + 2.0
    async with sc.traffic():
        hit = await hit_engine(chaos, Role.DECODE, signal.SIGSTOP)
        sc.fault(hit.at)
        replaced = await exited(hit.pid, HANG_FOR)  # its node agent may replace it; else it wakes up
        ended = time.time()
        signal_pid(hit.pid, signal.SIGCONT)
        what = "its node agent killed it" if replaced else "it was woken (SIGCONT)"
        print(f"   the hung engine is gone after {ended - hit.at:.1f} s: {what}", flush=True)
        took = await sc.converge(ended)
    sc.check(inv.fault_hit(hit.in_flight, hit.engine.label))
    entries = await sc.common(
        fault_ended=ended,
        took=took,
        stuck_after=hit.at + window,
        stuck_limit=FIRST_TOKEN_TIMEOUT - 1.0,
    )
    await sc.explain(entries, hit.at, hit.engine.instance_id)
    sc.finish()


async def test_two_engine_kills_inside_one_breaker_backoff(chaos: ChaosCluster) -> None:
    backoff = chaos.cfg.coordinator.breaker.backoff_initial
    sc = await Scenario.begin(
        chaos, f"union then decode engine SIGKILL inside one {backoff:g} s breaker backoff"
    )
    async with sc.traffic():
        first = await hit_engine(chaos, Role.UNION)
        sc.fault(first.at)
        await asyncio.sleep(1.0)
        second = await hit_engine(chaos, Role.DECODE)
        took = await sc.converge(second.at)
    assert second.at - first.at < backoff
    sc.check(inv.fault_hit(min(first.in_flight, second.in_flight), "each of the two engines"))
    entries = await sc.common(fault_ended=second.at, took=took)
    sc.check(resumed([first, second], entries))
    await sc.explain(entries, first.at, second.engine.instance_id)
    sc.finish()
