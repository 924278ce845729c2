"""The invariants a simulated run must keep, over the memory log's entries and the world's truth.

The chaos suite's pure functions are used as they are (`tests/chaos/invariants.py`: one start
per incarnation, re-convergence); the rest are what the simulator can check because it knows
the ground truth: no decision of a deposed leader in the log, no instance judged silent unless
a node really was (its agent killed, frozen or cut off: never the log's outage, nor a
controller's trouble), `motor replay --verify` reproducing every decision, every fold at the
end of the log, and nothing failing on a bug.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from controller.decide import decide
from core.codec import decode
from core.errors import DecodeError
from replay.verify import verify
from streams.definitions import MOTOR_STREAM
from streams.reader import Record
from tests.chaos import invariants as inv
from tests.chaos.harness import entry
from tests.sim.loop import EPOCH
from tests.sim.world import World

Check = inv.Check
Entry = inv.Entry

SLACK = 2.0  # seconds a node may still be quiet after its fault healed (restart, first beat)
_SILENT = re.compile(r"heartbeat (?:timeout|lost): (\S+) silent for ([0-9.]+)s")
LEADER_CHANGED = "controller.leader_changed"
COMMANDS = ("command.start", "command.stop")


def entries(world: World) -> list[Entry]:
    """MOTOR as stored now, read without the codec (poison included, as `<undecodable>`)."""
    s = world.server.streams.get(MOTOR_STREAM)
    return [] if s is None else [entry(m.seq, m.subject, m.data) for m in s.after(0, None)]


def one_start_per_incarnation(es: Sequence[Entry]) -> Check:
    return inv.one_start_per_incarnation(es)


def reconverged(took: float | None, within: float, why: str) -> Check:
    return inv.reconverged(took, within, "every instance ACTIVE, its engines answering", why)


def reigns_fenced(es: Sequence[Entry]) -> Check:
    """Every controller decision in the log comes from the leader of the reign it lands in,
    and every command carries that reign's term: the fence refused every deposed leader's write."""
    name = "9 no decision by a deposed leader"
    reign: tuple[str, int] | None = None
    bad: list[str] = []
    decisions = 0
    for e in es:
        if e.type == LEADER_CHANGED:
            reign = (str(e.data.get("leader_id")), int(e.data.get("term", 0)))
            continue
        if not e.source.startswith("controller/"):
            continue
        decisions += 1
        who = e.source.split("/", 1)[1]
        if reign is None or who != reign[0]:
            bad.append(f"seq {e.seq} {e.type} by {who} in the reign of {reign[0] if reign else 'nobody'}")
        elif e.type in COMMANDS and int(e.data.get("term", 0)) != reign[1]:
            bad.append(
                f"seq {e.seq} {e.type} by {who} carries term {e.data.get('term')}, the reign is {reign[1]}"
            )
    if bad:
        return Check(name, False, f"{len(bad)} decision(s) outside their reign: " + "; ".join(bad[:3]))
    return Check(name, True, f"{decisions} decision(s), each in its leader's reign")


def nothing_judged_by_outage(world: World, es: Sequence[Entry]) -> Check:
    """An instance judged silent (INACTIVE, TERMINATED on heartbeats) names a node that was
    silent for real: its agent killed, frozen or cut off around that time."""
    name = "4 nothing judged by an outage"
    judged, bad = 0, []
    for e in es:
        if e.type != "instance.state_changed" or e.data.get("state") not in inv.OUT_OF_SERVICE_BY_OUTAGE:
            continue
        m = _SILENT.search(str(e.data.get("reason", "")))
        if m is None:
            continue
        judged += 1
        node, quiet = m.group(1), float(m.group(2))
        at = e.ts - EPOCH
        if not world.was_silent(f"nodeagent/{node}", at - quiet, at, SLACK):
            bad.append(
                f"instance {e.data.get('instance_id')} {e.data.get('state')} at seq {e.seq}: {m.group(0)}"
            )
    if bad:
        return Check(
            name,
            False,
            f"{len(bad)} judged on a silence no fault of the node explains: " + "; ".join(bad[:3]),
        )
    return Check(name, True, f"{judged} silence judgement(s), each on a node that was silent")


def verify_agrees(world: World) -> Check:
    """`motor replay --verify` on MOTOR as it is: every decision re-derived from the log."""
    name = "11 replay --verify agrees"
    s = world.server.streams.get(MOTOR_STREAM)
    records = []
    for m in s.after(0, None) if s is not None else ():
        try:
            records.append(Record(MOTOR_STREAM, m.seq, m.subject, decode(m.data, m.subject), m.ts))
        except DecodeError:
            continue
    cfg = world.cfg
    report = verify(records, lambda st, now: decide(st, cfg, now))
    if not report.ok:
        return Check(
            name,
            False,
            f"{len(report.mismatches)} differ: " + "; ".join(x.render() for x in report.mismatches[:2]),
        )
    return Check(
        name,
        True,
        f"{report.verified} reproduced ({report.late} on the fold before a concurrent fact), "
        f"{report.unverifiable} on heartbeats, of {report.checked}",
    )


def folds_caught_up(world: World) -> Check:
    """Every running process folded MOTOR to its end (poison skipped, nothing stalled)."""
    name = "5 folding continues"
    s = world.server.streams.get(MOTOR_STREAM)
    behind, skipped = [], 0
    last = s.last_seq if s is not None else 0
    for p in world.processes():
        fold = p.fold()
        if not p.running or fold is None or s is None:
            continue
        skipped += sum(fold.skipped.values())
        mine = [m.seq for m in s.after(fold.position, fold.filter_subject)]  # what it has yet to fold
        if mine:
            behind.append(f"{p.name} at seq {fold.position} (its last is {mine[-1]})")
    if behind:
        return Check(name, False, f"MOTOR ends at seq {last}; behind: {', '.join(behind)}")
    return Check(
        name, True, f"every fold at the end of MOTOR (seq {last}); {skipped} poison event(s) skipped"
    )


def nothing_failed_on_a_bug(records: Sequence[logging.LogRecord]) -> Check:
    """No loop or part of any process failed with an exception it did not expect."""
    name = "12 nothing failed on a bug"
    bugs = [r for r in records if r.levelno >= logging.ERROR and r.exc_info]
    if bugs:
        r = bugs[0]
        exc = r.exc_info[1] if r.exc_info else None
        return Check(name, False, f"{len(bugs)} failure(s), first: {r.name}: {r.getMessage()}: {exc!r}")
    return Check(name, True, "no loop or part failed")


def routes_only_routable(world: World) -> Check:
    """Every route the coordinator chose named only endpoints its table holds routable and
    whose circuit was not open (a lone probe of a half-open one aside)."""
    name = "13 routing picks only routable endpoints"
    reqs = world.coordinator.routing.requests
    bad = [r for r in reqs if r.unroutable]
    if bad:
        r = bad[0]
        return Check(
            name,
            False,
            f"{len(bad)} of {len(reqs)} routes named excluded endpoints, first at {r.at:.1f}s: {r.unroutable}",
        )
    unrouted = sum(1 for r in reqs if not r.keys)
    unanswered = sum(1 for r in reqs if r.keys and not r.ok)
    retried = sum(r.retried for r in reqs)
    return Check(
        name,
        True,
        f"{len(reqs) - unrouted} routed, {unrouted} found no path, {unanswered} unanswered; {retried} attempt(s) "
        "met an engine that did not answer (before the log or the breaker knew) and went elsewhere",
    )


def routing_resumes(world: World, since: float) -> Check:
    """Once the cluster is whole again, every request is routed and answered."""
    name = "2 routing resumes"
    tail = [r for r in world.coordinator.routing.requests if r.at >= since]
    bad = [r for r in tail if not r.ok]
    if not tail:
        return Check(name, False, f"no request was routed after {since:.1f}s")
    if bad:
        r = bad[0]
        what = f"to {', '.join(r.keys)} unanswered" if r.keys else "no route"
        return Check(
            name,
            False,
            f"{len(bad)} of {len(tail)} requests failed after the cluster was whole (first at {r.at:.1f}s: {what})",
        )
    return Check(name, True, f"{len(tail)} requests after the cluster was whole, all answered")
