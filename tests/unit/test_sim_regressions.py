"""Bugs the seeded simulator found, each pinned by the seed that found it (tests/sim).

A seed is a whole schedule: the test replays it exactly (`just sim --seed N` shows the same run)
and asserts every invariant holds; where the bug had a consequence the schedule alone does not
reach, an epilogue drives the world on to it.
"""

from __future__ import annotations

import asyncio

from core.config import HealthCheckConfig
from tests.sim.checks import Check
from tests.sim.run import run_seed, sim_config
from tests.sim.world import World

SHIPPED_STARTUP = sim_config(startup_timeout=HealthCheckConfig().startup_timeout)


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


def test_seed_188_a_lost_tail_written_over_before_anyone_looked_is_found() -> None:
    """Seed 188's server restart loses MOTOR's last two events, and the nodes' re-registrations
    take those sequences again before the folds' watchers look: the last sequence never dropped
    below what was folded, so the controller kept a state holding facts the log had lost (an
    instance ACTIVE) and never folded again. A fold whose consumer was made again now checks the
    message it folded last is still the one the stream holds there (streams/lostlog.py's
    `overwritten`)."""
    assert _failures(188) == []


def test_seed_180_a_short_server_restart_judges_nobody_silent() -> None:
    """Seed 180's server restart takes the ordered consumers with it; the clients reconnect at
    once but notice only three idle heartbeats (6 s) later, and until then `hearing` said yes: a
    heartbeat_timeout under 6 s (the chaos suite's 4 s) judged every node silent. A fold now hears
    again only once its consumers were made after the reconnect."""
    assert _failures(180) == []


def test_seed_142_no_decision_on_a_fact_a_lost_tail_took() -> None:
    """Seed 142: between the server restart that lost MOTOR's tail and the fold's check of it,
    the leader decided on an instance's ACTIVE the log no longer held: converged, but with a
    decision `motor replay --verify` cannot derive. The leader now waits for that check."""
    assert _failures(142) == []


def test_seed_353_a_start_answered_from_memory_says_again_its_endpoints_are_ready() -> None:
    """Seed 353: a lost tail took a restart's start, the agent's answer and the engine's READY.
    The leader derived the same start again (same command id); the agent answered it from its
    memory and said nothing more, so the log never held a READY after that start and the
    instance waited RECOVERING for good. A start answered from memory is now followed by what
    its endpoints are (nodeagent/engines.py `report`). With the shipped startup_timeout: a
    shorter one only hides the stall (the leader resends after start_timeout + startup_timeout)."""
    assert _failures(353, cfg=SHIPPED_STARTUP) == []


def test_seed_389_a_start_answered_from_memory_says_its_engine_died_since() -> None:
    """Seed 389: as 353, but the engine that lost start made has died since: answering from
    memory left nothing running. Its DEAD is now said again after the start, and the leader
    restarts it."""
    assert _failures(389, cfg=SHIPPED_STARTUP) == []


def test_seed_266_no_decision_before_the_fold_is_checked_after_a_reconnect() -> None:
    """Seed 266: a server restart lost MOTOR's tail; right after the reconnect a controller won
    the lease (its fold had reached the shorter stream at once) and decided on facts the tail
    took, before its watcher made the consumer again. A fold is not `checked` while its MOTOR
    consumer predates the last reconnect."""
    assert _failures(266) == []


def test_seed_1217_a_node_whose_dead_engine_was_stopped_can_serve_again() -> None:
    """Seed 1217: an engine hung for good was reported `engine_dead` and replaced; the agent's
    fault about that engine stayed open after it was stopped, so its node sat out assembly for
    good, and when the replacement failed no prefill was left. The fault reporter now clears the
    faults of an engine that is gone (nodeagent/faults.py `on_engine_gone`)."""
    assert _failures(1217) == []


def test_seed_986_a_standby_back_from_a_checkpoint_checks_its_fold_after_a_reconnect() -> None:
    """Seed 986: a standby restarted from a checkpoint had folded nothing since, so its fold
    knew no stream time for the message it started after; a server restart lost MOTOR's tail
    and the node agents wrote over it, and the standby, reconnected, took the lease and decided
    on the checkpoint's facts the log no longer had (replay --verify: DEGRADED on a state the
    log never held). A fold started from a checkpoint now learns that message's time first, so
    a reconnect checks it like any other."""
    assert _failures(986) == []
