"""Bugs the seeded simulator found, each pinned by the seed that found it (tests/sim).

A seed is a whole schedule: the test replays it exactly (`just sim --seed N` shows the same run)
and asserts every invariant holds; where the bug had a consequence the schedule alone does not
reach, an epilogue drives the world on to it.
"""

from __future__ import annotations

import asyncio

from tests.sim.checks import Check
from tests.sim.run import run_seed
from tests.sim.world import World


def _failures(seed: int, **kw: object) -> list[str]:
    r = run_seed(seed, **kw)  # type: ignore[arg-type]
    return [f"{c.invariant}: {c.detail}" for c in r.failed()]


async def _leader_killed_standby_leads(world: World) -> list[Check]:
    """Kill the leader of the quiet cluster: the other controller, restarted earlier from a
    checkpoint at the log's end, must lead within two lease TTLs."""
    ttl = world.cfg.controller.lease_ttl
    old = world.leader()
    if old is None:
        return [Check("39 a standby takes over a quiet log", False, "no leader before the kill")]
    old.crash()
    for _ in range(int(4 * ttl / 0.1)):
        await asyncio.sleep(0.1)
        new = world.leader()
        if new is not None:
            return [Check("39 a standby takes over a quiet log", True, f"{new.name} leads")]
    return [
        Check("39 a standby takes over a quiet log", False, f"no leader {4 * ttl:g}s after {old.name} died")
    ]


def test_seed_39_a_controller_back_from_a_checkpoint_at_the_logs_end_can_lead() -> None:
    """Seed 39 kills c1, which comes back from a checkpoint at MOTOR's last sequence. Its
    LiveFold started after the checkpoint said it had handled nothing (position 0), so a takeover's
    `wait_for(last_seq)` waited for an event a quiet log never appends: with the leader killed,
    the cluster had no leader until some node event landed (streams/livefold.py)."""
    assert _failures(39, then=_leader_killed_standby_leads) == []


def test_seed_32_a_lost_tail_that_held_readys_is_answered_by_registering_again() -> None:
    """Seed 32 loses MOTOR's tail twice: the second time the engines' READY events went with it.
    The node agents' resync found their registration and instance still in the log and did not
    register again, so the log said STARTING for engines that served, and the leader waits
    start_timeout + startup_timeout (30 min by default) before asking again. After a lost log a
    node now registers again with what it runs (nodeagent/resync.py), as its docstring said."""
    assert _failures(32) == []
