"""What a fault across hosts must not do, as pure functions over what a scenario recorded.

Beside the chaos suite's invariants (tests/chaos/invariants.py: clients, one start per
incarnation, engines kept, re-convergence), a cluster spread over hosts promises three more:
every event JetStream acknowledged is still in the log afterwards; a host cut off from the
majority decides nothing while it is cut; the majority goes on deciding without it. The table
tests are tests/unit/test_multihost_invariants.py.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from tests.chaos.invariants import Check, Entry

# Time an append already on the wire at the cut may take to land.
IN_FLIGHT_GRACE = 1.0


def acked_kept(result: Mapping[str, Any] | None, why: str = "") -> Check:
    """Every event a publisher got an ack for is in the log (`motor events acked --json`)."""
    name = "11 acknowledged writes kept"
    if result is None:
        return Check(name, False, f"the ack audit did not run: {why}")
    acked = int(result.get("acked", 0))
    missing = list(result.get("missing", []))
    if acked == 0:
        return Check(name, False, "no publisher recorded an ack (is MOTOR_ACK_JOURNAL set?)")
    if missing:
        first = missing[0]
        return Check(
            name,
            False,
            f"{len(missing)} of {acked} acknowledged events are not in the log "
            f"(first: {first.get('type')} {first.get('id')} acked at seq {first.get('seq')})",
        )
    return Check(name, True, f"all {acked} acknowledged events are in the log")


def minority_decided_nothing(
    entries: Sequence[Entry], cut_sources: Collection[str], cut_at: float, healed_at: float
) -> Check:
    """No process of the cut host appended a decision from the cut until it announced a reign of
    its own again (a controller), and nothing it decided while cut landed after the heal."""
    name = "12 the minority decides nothing"
    deciders = {s for s in cut_sources if s.startswith("controller/")}
    bad: list[Entry] = []
    reigns: set[str] = set()
    for e in entries:
        if e.source not in deciders or e.ts <= cut_at + IN_FLIGHT_GRACE:
            continue
        if e.type == "controller.leader_changed" and e.ts > healed_at:
            reigns.add(e.source)  # leading again after the heal, under a new term
            continue
        if e.source not in reigns:
            bad.append(e)
    if bad:
        e = bad[0]
        return Check(
            name,
            False,
            f"{len(bad)} event(s) from the cut side: first {e.type} by {e.source} at seq {e.seq} "
            f"({e.ts - cut_at:+.1f} s after the cut)",
        )
    who = ", ".join(sorted(deciders)) or "no controller"
    return Check(name, True, f"nothing from {who} between the cut and a reign of its own")


def majority_went_on(
    entries: Sequence[Entry],
    *,
    cut_at: float,
    healed_at: float,
    leader_was_cut: bool,
    cut_instances: Collection[int],
    other_instances: Collection[int] = (),
) -> Check:
    """The majority side kept deciding: a leader announced without the cut host when the leader
    was on it, each of the cut host's instances taken out of routing (INACTIVE) while cut, and
    every instance of the other hosts left serving (a client of the cut server must move to
    a server it can reach before its heartbeats are missed)."""
    name = "13 the majority goes on"
    problems: list[str] = []
    during = [e for e in entries if cut_at < e.ts < healed_at]
    judged = sorted(
        {
            int(e.data.get("instance_id", -1))
            for e in during
            if e.type == "instance.state_changed"
            and e.data.get("state") in ("INACTIVE", "TERMINATED", "ISOLATED")
            and int(e.data.get("instance_id", -1)) in other_instances
        }
    )
    if judged:
        problems.append(f"instance(s) {judged} of the hosts that were not cut left routing")
    if leader_was_cut and not any(e.type == "controller.leader_changed" for e in during):
        problems.append("no controller announced itself leader while the leader's host was cut")
    inactive = {
        int(e.data.get("instance_id", -1))
        for e in during
        if e.type == "instance.state_changed" and e.data.get("state") == "INACTIVE"
    }
    missing = sorted(set(cut_instances) - inactive)
    if missing:
        problems.append(f"instance(s) {missing} of the cut host never left routing (no INACTIVE while cut)")
    if problems:
        return Check(name, False, "; ".join(problems))
    led = "a new leader and " if leader_was_cut else ""
    return Check(name, True, f"{led}instance(s) {sorted(cut_instances)} INACTIVE while cut")


def no_start_for(entries: Sequence[Entry], instances: Collection[int], since: float) -> Check:
    """The cut host's instances came back with their engines: no start command for them."""
    name = "14 back without a restart"
    starts = [
        e
        for e in entries
        if e.type == "command.start" and e.ts >= since and int(e.data.get("instance_id", -1)) in instances
    ]
    if starts:
        e = starts[0]
        return Check(
            name,
            False,
            f"{len(starts)} start command(s) for the cut host's instances "
            f"(first: instance {e.data.get('instance_id')} on {e.data.get('node_id')} at seq {e.seq})",
        )
    return Check(name, True, f"instance(s) {sorted(instances)} ACTIVE again without a start command")


def log_leader_elected(old: str, placement: Any, took: float | None, within: float) -> Check:
    """The servers left elected another leader of MOTOR within nats-server's election time."""
    name = "15 a new log leader"
    if took is None:
        return Check(name, False, f"no leader other than {old} within {within:g} s ({placement.describe()})")
    if took > within:
        return Check(name, False, f"{old} -> {placement.leader} only after {took:.1f} s (limit {within:g} s)")
    return Check(name, True, f"MOTOR leader {old} -> {placement.leader} in {took:.1f} s")
