"""The invariants of issue 11 as pure functions over what a scenario recorded.

Inputs are plain data: client outcomes (`tests.chaos.load.Outcome`), log entries read raw
from MOTOR (`Entry`: type and data as stored, so event types this branch does not know yet —
the coordinator's — are seen too), process tables, metric samples, timings. Each function
returns one `Check`; a scenario prints them all and fails on any that is not ok. The fast
table tests are tests/unit/test_chaos_invariants.py.
"""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.load import Outcome

OUT_OF_SERVICE_BY_OUTAGE = ("INACTIVE", "TERMINATED")


@dataclass(frozen=True, slots=True)
class Check:
    """One invariant's verdict in one scenario."""

    invariant: str  # "1 client outcomes", "9 leader failover", …
    ok: bool
    detail: str


@dataclass(frozen=True, slots=True)
class Entry:
    """One MOTOR message as stored: sequence, subject, type and data (None when undecodable)."""

    seq: int
    subject: str
    type: str
    ts: float
    data: Mapping[str, Any] = field(default_factory=dict)
    caused_by: str | None = None
    source: str = ""  # who appended it: `controller/c1`, `nodeagent/union-0`, …


# --------------------------------------------------------------------------- 1 clients


def client_outcomes(
    outcomes: Sequence[Outcome],
    refs: Mapping[str, str],
    *,
    reconnect_until: float | None = None,
    stuck_after: float | None = None,
    stuck_limit: float = 0.0,
    origin: float = 0.0,
) -> Check:
    """Every request succeeded with the text of an undisturbed run; no 5xx, no broken stream.

    `reconnect_until`: a coordinator replica died; a request whose connection broke and that
    started before this time may have been retried by its client (its retry must succeed).
    `stuck_after`/`stuck_limit`: an engine hung; a request started after the health-check
    window must not take longer than `stuck_limit` (it must not have been sent to the hung one).
    Times in the detail are relative to `origin` (the fault).
    """
    name = "1 client outcomes"
    if not outcomes:
        return Check(name, False, "no request ran: the load generator recorded nothing")
    failed = [o for o in outcomes if not o.ok]
    wrong = [o for o in outcomes if o.ok and o.text != refs.get(o.spec)]
    bad_retry = [
        o
        for o in outcomes
        if o.retried
        and (reconnect_until is None or o.started > reconnect_until or not o.first_error_connection)
    ]
    stuck = [
        o
        for o in outcomes
        if stuck_after is not None and o.started > stuck_after and o.ended - o.started > stuck_limit
    ]
    problems = []
    if failed:
        by = collections.Counter(o.failure() for o in failed)
        first = min(failed, key=lambda o: o.started)
        kinds = "; ".join(f"{n}× {what}" for what, n in by.most_common(3))
        problems.append(
            f"{len(failed)} of {len(outcomes)} failed ({kinds}; first started at {first.started - origin:+.1f} s)"
        )
    if wrong:
        o = wrong[0]
        problems.append(
            f"{len(wrong)} answered a text that differs from the undisturbed run "
            f"(first: {o.describe(origin)} got {o.text[:40]!r}…, expected {refs.get(o.spec, '?')[:40]!r}…)"
        )
    if bad_retry:
        problems.append(
            f"{len(bad_retry)} needed a client retry outside a replica's death "
            f"(first: {bad_retry[0].describe(origin)}: {bad_retry[0].first_error})"
        )
    if stuck:
        worst = max(stuck, key=lambda o: o.ended - o.started)
        problems.append(
            f"{len(stuck)} started after the hang left routing still took > {stuck_limit:g} s "
            f"(worst {worst.ended - worst.started:.1f} s: {worst.describe(origin)})"
        )
    if problems:
        return Check(name, False, "; ".join(problems))
    streams = sum(1 for o in outcomes if o.stream)
    retried = sum(1 for o in outcomes if o.retried)
    extra = f", {retried} retried by the client after its replica died" if retried else ""
    return Check(
        name, True, f"{len(outcomes)} requests ({streams} streams) all succeeded, texts equal{extra}"
    )


def fault_hit(in_flight: int, what: str) -> Check:
    """The fault met requests in flight (else a mid-stream scenario proves nothing)."""
    name = "0 fault hit traffic"
    if in_flight <= 0:
        return Check(name, False, f"{what} had no request in flight when it was hit: nothing routed to it")
    return Check(name, True, f"{what} had {in_flight} request(s) in flight when it was hit")


# --------------------------------------------------------------------------- 2 routing resumes


def routing_resumed(recovered: Mapping[str, tuple[float | None, float | None]], within: float) -> Check:
    """Each recovered endpoint served again within `within` s of reporting READY as a new process.

    `recovered`: endpoint label -> (time of its READY after the fault, time it was first seen
    serving a request after that); None when it never happened.
    """
    name = "2 routing resumes"
    problems, fine = [], []
    for label, (ready, served) in sorted(recovered.items()):
        if ready is None:
            problems.append(f"{label} never reported READY again")
        elif served is None:
            problems.append(f"{label} READY again but no request reached it")
        elif served - ready > within:
            problems.append(f"{label} served {served - ready:.1f} s after READY (limit {within:g} s)")
        else:
            fine.append(f"{label} served {max(0.0, served - ready):.1f} s after READY")
    if problems:
        return Check(name, False, "; ".join(problems))
    return Check(name, True, "; ".join(fine) or "nothing to recover")


# --------------------------------------------------------------------------- 3 processes


@dataclass(frozen=True, slots=True)
class Proc:
    """A Motor process as the scenario saw it at the end."""

    alive: bool
    restarts: int  # by the supervisor, during the scenario
    pid_changed: bool = False


def processes(procs: Mapping[str, Proc], *, killed: Iterable[str] = (), nats_trouble: bool = False) -> Check:
    """Every process alive; only the ones the fault killed were restarted (by the supervisor).

    A restart of a process the fault did not touch means it crashed; with `nats_trouble`, a
    controller that was restarted exited because NATS was slow or away.
    """
    name = "3 processes"
    killed = set(killed)
    problems = []
    for pname, p in sorted(procs.items()):
        if not p.alive:
            problems.append(f"{pname} is not running")
        elif pname in killed and p.restarts == 0 and not p.pid_changed:
            problems.append(f"{pname} was killed but not restarted by the supervisor")
        elif pname not in killed and p.restarts:
            why = "exited on NATS trouble" if nats_trouble and pname.startswith("controller") else "crashed"
            problems.append(f"{pname} {why}: restarted {p.restarts}× by the supervisor")
    if problems:
        return Check(name, False, "; ".join(problems))
    back = ", ".join(sorted(killed)) or "none"
    return Check(name, True, f"{len(procs)} processes alive; restarted after the kill: {back}")


# --------------------------------------------------------------------------- 4 outage


def nothing_judged_by_outage(entries: Sequence[Entry], since: float) -> Check:
    """No instance went INACTIVE or TERMINATED because the log was away (after `since`)."""
    name = "4 nothing judged by the outage"
    bad = [
        e
        for e in entries
        if e.type == "instance.state_changed"
        and e.ts >= since
        and str(e.data.get("state")) in OUT_OF_SERVICE_BY_OUTAGE
    ]
    if bad:
        e = bad[0]
        return Check(
            name,
            False,
            f"{len(bad)} instance(s) judged by the outage: instance {e.data.get('instance_id')} "
            f"{e.data.get('state')} at seq {e.seq} ({e.data.get('reason', '')})",
        )
    return Check(name, True, "no instance went INACTIVE or TERMINATED")


def nobody_judged_by_a_clock(entries: Sequence[Entry]) -> Check:
    """No instance went INACTIVE or TERMINATED, and no engine was stopped, while clocks were
    stepped (every entry given: their `ts` is the stepped clocks' own, so it cannot choose)."""
    name = "4 nobody judged by a clock"
    bad = [
        e
        for e in entries
        if (e.type == "instance.state_changed" and str(e.data.get("state")) in OUT_OF_SERVICE_BY_OUTAGE)
        or e.type == "command.stop"
    ]
    if bad:
        e = bad[0]
        what = e.data.get("state") or e.type
        return Check(
            name,
            False,
            f"{len(bad)} judgement(s) while clocks stepped: instance {e.data.get('instance_id')} "
            f"{what} at seq {e.seq} ({e.data.get('reason', '')})",
        )
    return Check(
        name, True, f"no instance went INACTIVE or TERMINATED, no engine stopped ({len(entries)} entries)"
    )


# --------------------------------------------------------------------------- 5 poison


_SKIPPED = re.compile(r"^(motor_\w+?)_events_skipped_total\{([^}]*)\}\s+([0-9.eE+-]+|NaN|\+Inf)\s*$")


def skipped_counts(metrics_text: str) -> dict[tuple[str, str], float]:
    """(metric family, reason) -> count, from `motor_*_events_skipped_total{reason=…}` samples."""
    out: dict[tuple[str, str], float] = collections.defaultdict(float)
    for line in metrics_text.splitlines():
        m = _SKIPPED.match(line.strip())
        if m is None:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if "reason" not in labels:
            continue
        out[(m.group(1), labels["reason"])] += float(m.group(3))
    return dict(out)


def poison_handled(
    kind: str,
    *,
    skipped_delta: Mapping[str, float],
    must_skip: bool,
    folded_past: Mapping[str, bool],
) -> Check:
    """The poison was skipped and counted by every folding component, and folding went on.

    `skipped_delta`: component -> increase of its skipped counter (summed over reasons);
    `folded_past`: component -> whether it folded a good event appended after the poison.
    """
    name = "5 poison skipped, folding continues"
    problems = []
    stalled = sorted(c for c, ok in folded_past.items() if not ok)
    if stalled:
        problems.append(f"stopped folding at the {kind}: {', '.join(stalled)}")
    if must_skip:
        uncounted = sorted(c for c, d in skipped_delta.items() if d < 1)
        if uncounted:
            problems.append(
                f"the {kind} is not counted in motor_*_events_skipped_total{{reason}} by {', '.join(uncounted)}"
            )
    if problems:
        return Check(name, False, "; ".join(problems))
    counted = (
        ", ".join(f"{c} +{d:g}" for c, d in sorted(skipped_delta.items())) if must_skip else "not a skip"
    )
    return Check(name, True, f"{kind}: folding continued everywhere ({counted})")


# --------------------------------------------------------------------------- 6 decisions

# Events that may legitimately make the controller start a node's engine again.
_NEW_INCARNATION = frozenset(
    {
        "command.stop",
        "command.refused",
        "endpoint.status_changed",
        "node.registered",
        "node.deregistered",
        "instance.assembled",
        "instance.state_changed",
    }
)


def one_start_per_incarnation(entries: Sequence[Entry]) -> Check:
    """No start command repeated: two starts of one instance on one node with the same attempt
    need something in between (a stop, a status, a re-registration, a state change)."""
    name = "6 one start per incarnation"
    last_start: dict[tuple[int, str], Entry] = {}
    since_start: dict[tuple[int, str], bool] = {}
    dups = []
    for e in entries:
        if e.type == "command.start":
            key = (int(e.data.get("instance_id", -1)), str(e.data.get("node_id")))
            prev = last_start.get(key)
            if (
                prev is not None
                and not since_start.get(key, False)
                and prev.data.get("attempt", 1) == e.data.get("attempt", 1)
            ):
                dups.append((prev, e))
            last_start[key] = e
            since_start[key] = False
            continue
        if e.type not in _NEW_INCARNATION:
            continue
        node = e.data.get("node_id")
        iid = e.data.get("instance_id")
        for key in since_start:
            if (node is not None and key[1] == node) or (iid is not None and key[0] == iid):
                since_start[key] = True
    if dups:
        a, b = dups[0]
        return Check(
            name,
            False,
            f"{len(dups)} repeated start(s): instance {b.data.get('instance_id')} on {b.data.get('node_id')} "
            f"attempt {b.data.get('attempt', 1)} at seq {a.seq} and again at seq {b.seq} with nothing between",
        )
    n = sum(1 for e in entries if e.type == "command.start")
    return Check(name, True, f"{n} start command(s), none repeated")


# --------------------------------------------------------------------------- 7 engines


def engines_kept(
    before: Mapping[int, int | None], after: Mapping[int, int | None], entries: Sequence[Entry], since: float
) -> Check:
    """Node agents kept their engines through NATS trouble: same pids, no stop in the log."""
    name = "7 engines kept"
    changed = sorted(p for p, pid in before.items() if pid is None or after.get(p) != pid)
    stops = [e for e in entries if e.type == "command.stop" and e.ts >= since]
    problems = []
    if changed:
        problems.append(f"engine(s) on port(s) {', '.join(map(str, changed))} were stopped or restarted")
    if stops:
        problems.append(f"{len(stops)} stop command(s) in the log (first at seq {stops[0].seq})")
    if problems:
        return Check(name, False, "; ".join(problems))
    return Check(name, True, f"{len(before)} engine(s) kept their process")


# --------------------------------------------------------------------------- 8 re-convergence


def reconverged(took: float | None, within: float, what: str, why: str = "") -> Check:
    """`what` (all ACTIVE and routed to, or the log's fold holding the truth) within `within` s."""
    name = "8 re-convergence"
    if took is None:
        return Check(name, False, f"not {what} within {within:g} s" + (f": {why}" if why else ""))
    if took > within:
        return Check(name, False, f"{what} only after {took:.1f} s (limit {within:g} s)")
    return Check(name, True, f"{what} {took:.1f} s after the fault ended")


# --------------------------------------------------------------------------- 9 failover


def failover(killed_at: float, decided_at: float | None, within: float, standby: str) -> Check:
    """The standby decided (announced itself leader) within `within` s of the leader's kill -9."""
    name = "9 leader failover"
    if decided_at is None:
        return Check(name, False, f"{standby} never announced itself leader")
    took = decided_at - killed_at
    if not math.isfinite(took) or took > within:
        return Check(name, False, f"{standby} decided {took:.1f} s after the kill (limit {within:g} s)")
    return Check(name, True, f"{standby} decided {took:.2f} s after the kill")


# --------------------------------------------------------------------------- 10 explain


def explained(entries: Sequence[Entry], since: float, explain_text: str) -> Check:
    """The log holds the coordinator's view of the fault (`coordinator.*` events) and
    `motor replay --explain` shows it beside the engine's facts."""
    name = "10 the log explains it"
    coord = [e for e in entries if e.type.startswith("coordinator.") and e.ts >= since]
    problems = []
    if not coord:
        problems.append("no coordinator.* event (circuit, broken/continued streams) in the log")
    # Shown by type name, or as a line that names the deciding replica ("… by coordinator-1").
    replicas = {str(e.data["coordinator"]) for e in coord if e.data.get("coordinator")}
    if "coordinator." not in explain_text and not any(r in explain_text for r in replicas):
        problems.append("`motor replay --explain` shows nothing of the coordinator")
    if problems:
        return Check(name, False, "; ".join(problems))
    kinds = ", ".join(sorted({e.type for e in coord}))
    return Check(name, True, f"{len(coord)} coordinator event(s): {kinds}")


# --------------------------------------------------------------------------- 11 latency


def latency_bound(outcomes: Sequence[Outcome], limit: float, *, origin: float = 0.0) -> Check:
    """No request took longer than `limit` s, from its first attempt to its last byte (a
    client's retry after a connection reset included), with the distribution to show it."""
    name = "11 latency bound"
    if not outcomes:
        return Check(name, False, "no request ran")
    took = sorted(o.ended - o.started for o in outcomes)
    p50, p99 = took[len(took) // 2], took[min(len(took) - 1, math.ceil(len(took) * 0.99) - 1)]
    worst = max(outcomes, key=lambda o: o.ended - o.started)
    retried = [o.ended - o.started for o in outcomes if o.retried]
    figures = f"p50 {p50:.2f} s, p99 {p99:.2f} s, max {took[-1]:.2f} s"
    if retried:
        figures += f"; {len(retried)} retried after a reset, slowest {max(retried):.2f} s"
    slow = [t for t in took if t > limit]
    if slow:
        return Check(
            name,
            False,
            f"{len(slow)} of {len(took)} took over {limit:g} s (worst {worst.describe(origin)}); {figures}",
        )
    return Check(name, True, f"{len(took)} requests within {limit:g} s: {figures}")


# --------------------------------------------------------------------------- 12 replaced


def replica_replaced(
    *,
    frozen_at: float,
    killed_at: float | None,
    within: float,
    pid_before: int,
    pid_after: int | None,
    served_after: float,
    restarts: int,
    continued: bool | None,
) -> Check:
    """A frozen replica was killed within `within` s, exactly one fresh one took its place
    and served requests, and the SIGCONT meant for the frozen one found nothing to wake."""
    name = "12 frozen replica replaced"
    if killed_at is None:
        return Check(name, False, "the frozen replica was never taken out of the port")
    took = killed_at - frozen_at
    problems = []
    if took > within:
        problems.append(f"killed only {took:.1f} s after it froze (limit {within:g} s)")
    if pid_after is None or pid_after == pid_before:
        problems.append(f"no new process serves (pid before {pid_before}, now {pid_after})")
    elif served_after <= 0:
        problems.append(f"the new process {pid_after} served no request")
    if restarts != 1:
        problems.append(f"restarted {restarts}× (one restart expected)")
    if continued:
        problems.append("the frozen process was still there for the SIGCONT")
    if problems:
        return Check(name, False, "; ".join(problems))
    return Check(
        name,
        True,
        f"killed {took:.1f} s after it froze (limit {within:g} s); pid {pid_before} → {pid_after}, "
        f"which served {served_after:g} requests; the SIGCONT found the frozen one gone",
    )


# --------------------------------------------------------------------------- report


def report(title: str, checks: Sequence[Check]) -> str:
    """The table a scenario prints: one line per invariant."""
    lines = [f"== chaos: {title}"]
    for c in checks:
        lines.append(f"  {'PASS' if c.ok else 'FAIL'}  {c.invariant:<38} {c.detail}")
    return "\n".join(lines)
