"""Clock steps under client traffic (issue 24 item 4): a node agent's wall clock stepped an hour
back and an hour ahead, then both controllers' an hour ahead and an hour back, each held for
longer than `heartbeat_timeout`, on the real processes (Debian's libfaketime, tests/faketime.py).

Before, liveness compared the heartbeat's `ts` (the node's clock) with the controller's: the
first step terminated the union instance at once, a controller stepped forward terminated all
of them. Now nothing is judged: silence is measured on the controller's monotonic clock.

The stepped processes are started again with the clock preloaded before the scenario begins
(the agent SIGKILLed, its engines run on and are adopted; the controllers stopped gracefully,
standby first, so the lease passes once) and started again without it after.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from deploy.cluster import LocalCluster
from tests.chaos import invariants as inv
from tests.chaos.faults import child_pid, exited
from tests.chaos.fleet import converged, scrape
from tests.chaos.harness import ChaosCluster
from tests.chaos.scenario import Scenario
from tests.faketime import HOUR, SteppedClock
from tests.localcluster import kill_child, restart_child

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600)]

AGENT = "nodeagent-union-0"


async def respawn(cluster: LocalCluster, name: str, env: dict[str, str], sig: int) -> None:
    """Stop `name` with `sig` and start it again with `env` in its environment (kept across a
    supervisor restart); the supervisor leaves it alone meanwhile."""
    with cluster.supervisor.hold(name):
        pid = child_pid(cluster, name)
        kill_child(cluster, name, sig)
        if pid is not None:
            assert await exited(pid, within=30.0), f"{name} did not exit on {signal.Signals(sig).name}"
        restart_child(cluster, name, env=env)


async def controller_back(cc: ChaosCluster, name: str, within: float = 30.0) -> None:
    """Wait until `name` answers its liveness and some controller leads."""
    deadline = time.monotonic() + within
    url = f"http://127.0.0.1:{cc.controller_ports()[name]}/liveness"
    while await scrape(url, limit=2) is None or await cc.leader() is None:
        assert time.monotonic() < deadline, f"{name} not back, or no leader, within {within:g} s"
        await asyncio.sleep(0.2)  # polling processes: nothing to await


@asynccontextmanager
async def stepped(cc: ChaosCluster) -> AsyncIterator[tuple[SteppedClock, SteppedClock]]:
    """(the agent's clock, the controllers' clock): their processes run on them inside."""
    agent = SteppedClock(cc.base / "clock-agent")
    controllers = SteppedClock(cc.base / "clock-controllers")
    leader = await cc.leader()
    names = sorted(cc.cluster.controller_names(), key=lambda n: n == leader)  # the standby first

    async def each(with_clock: bool) -> None:
        await respawn(cc.cluster, AGENT, agent.env() if with_clock else {}, signal.SIGKILL)
        for name in names:
            await respawn(cc.cluster, name, controllers.env() if with_clock else {}, signal.SIGTERM)
            await controller_back(cc, name)
        await cc.wait_until("every instance ACTIVE", converged, 60)
        await cc.wait_serving(30)

    await each(True)
    try:
        yield agent, controllers
    finally:
        await each(False)


async def test_clock_step(chaos: ChaosCluster) -> None:
    hold = chaos.cfg.controller.heartbeat_timeout * 2 + 2.0
    async with stepped(chaos) as (agent, controllers):
        title = f"clock step: {AGENT} -1 h then +1 h, controllers +1 h then -1 h, each held {hold:g} s"
        sc = await Scenario.begin(chaos, title)
        async with sc.traffic():
            sc.fault(time.time())
            for clock, offsets in ((agent, (-HOUR, HOUR)), (controllers, (HOUR, -HOUR))):
                for offset in offsets:
                    await clock.step(offset)
                    await asyncio.sleep(hold)
                await clock.step(0.0)
            ended = time.time()
            took = await sc.converge(ended, floor=1.0)
        entries = await sc.common(fault_ended=ended, took=took)
        sc.check(inv.nobody_judged_by_a_clock(entries))
        sc.finish()
