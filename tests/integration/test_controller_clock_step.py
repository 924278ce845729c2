"""Issue 24 item 4 on real processes: a node agent's or the controller's wall clock an hour off,
and stepped an hour the other way while it runs (Debian's libfaketime, tests/faketime.py).

Before, silence was a heartbeat's `ts` (the node's clock) against the controller's: a node an
hour behind, or a controller stepped an hour forward, had every instance terminated at once
(an hour of "silence" against `terminate_after` 30 s); a node ahead, or a controller stepped
back, was never judged silent. Now healthy instances stay ACTIVE through every step, and an
agent that truly stops beating is judged on the controller's monotonic clock, on time.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

from tests.faketime import HOUR, SteppedClock
from tests.integration.controller_harness import CONTROLLER, Cluster, state_is

TIMEOUT = CONTROLLER["heartbeat_timeout"]
HOLD = 4 * TIMEOUT  # long enough that a misjudged node would have been moved
# From the stop: its last heartbeat went out up to one interval (0.3 s) before it, and a tick
# (0.2 s) and a busy CI machine may come after.
JUDGED_AFTER = TIMEOUT - 0.5
JUDGED_WITHIN = TIMEOUT + 3.0
SILENT_FOR = re.compile(r"silent for ([0-9.]+)s")


def moves(cluster: Cluster, after: int) -> list[str]:
    """What the controller did to instances or nodes since `after`: state changes and stops."""
    return [
        f"{ev.type} {getattr(ev.data, 'instance_id', '')} {getattr(ev.data, 'reason', '')}"
        for ev in cluster.tail.events(lambda ev: ev.type in ("instance.state_changed", "command.stop"), after)
    ]


async def both_active(cluster: Cluster) -> None:
    await cluster.tail.wait(state_is(1, "ACTIVE"), within=60)
    await cluster.tail.wait(state_is(2, "ACTIVE"), within=60)


def inactive_because_of(node_id: str) -> Any:
    return lambda ev: (
        ev.type == "instance.state_changed"
        and ev.data.state == "INACTIVE"
        and f" {node_id} " in ev.data.reason
    )


async def judged_on_time_when_it_stops(cluster: Cluster, node_id: str, after: int) -> None:
    """SIGSTOP the agent (its engines run on): its instance goes INACTIVE once it has been
    silent for `heartbeat_timeout`, by the test's clock and by the reason's own figure."""
    agent = cluster.agents[node_id]
    assert agent.proc is not None
    os.kill(agent.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    ev = await cluster.tail.wait(inactive_because_of(node_id), within=JUDGED_WITHIN + 10.0, after=after)
    took = time.monotonic() - stopped
    assert JUDGED_AFTER <= took < JUDGED_WITHIN, f"judged silent {took:.1f}s after the stop\n{cluster.logs()}"
    said = SILENT_FOR.search(ev.data.reason)
    assert said is not None and TIMEOUT <= float(said.group(1)) < JUDGED_WITHIN, ev.data.reason


async def test_node_agents_an_hour_behind_and_ahead_keep_their_instances_active(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.configure(union=2)
    behind = SteppedClock(tmp_path / "n1.clock", -HOUR)
    ahead = SteppedClock(tmp_path / "n2.clock", +HOUR)
    c1 = cluster.controller("c1")
    await c1.wait_http("/readiness")
    cluster.agent("n1", env=behind.env())
    cluster.agent("n2", env=ahead.env())
    await both_active(cluster)
    mark = cluster.tail.index()
    await asyncio.sleep(HOLD)
    assert moves(cluster, mark) == [], cluster.logs()  # before: both terminated at once
    await behind.step(+HOUR)  # each clock crosses the controller's, two hours in one step
    await ahead.step(-HOUR)
    await asyncio.sleep(HOLD)
    assert moves(cluster, mark) == [], cluster.logs()
    await judged_on_time_when_it_stops(cluster, "n1", mark)  # an hour ahead now: before, never judged


async def test_a_controller_clock_stepped_an_hour_forward_and_back_terminates_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.configure(union=2)
    clock = SteppedClock(tmp_path / "c1.clock")
    c1 = cluster.controller("c1", env=clock.env())
    await c1.wait_http("/readiness")
    cluster.agent("n1")
    cluster.agent("n2")
    await both_active(cluster)
    mark = cluster.tail.index()
    await clock.step(+HOUR)
    await asyncio.sleep(HOLD)
    assert moves(cluster, mark) == [], cluster.logs()  # before: both terminated within a tick
    await clock.step(-HOUR)
    await asyncio.sleep(HOLD)
    assert moves(cluster, mark) == [], cluster.logs()
    await judged_on_time_when_it_stops(cluster, "n1", mark)  # before: an hour back, never judged
    status, body = await c1.get("/readiness")
    assert status == 200, body  # still the leader across both steps: the lease is on monotonic time
