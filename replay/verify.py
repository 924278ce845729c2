"""`motor replay --verify`: re-run a decide function over the log, report what differs.

For every decision the controller logged, fold the log up to just before it and ask the
current code's `decide(state, now=decision.ts)` whether it would make the same decision (same
derived id). A decision it would not make is nondeterminism or version drift. Decisions that
answer heartbeat silence cannot be re-derived (heartbeats are not kept in the log) and are
counted apart.

The leader decides on its fold, which may not have reached what landed meanwhile: a node's
READY can land between the fold the leader decided on and its decision (found by the seeded
simulator, tests/sim, seed 147). So a decision the state just before it does not give is tried
on the folds before that, back to the event it answers (`caused_by`, at most `LOOK_BACK`
events), each with the decisions of its own batch before it (one decide call: one source and
one `ts`, contiguous in the log); reproduced there, it counts as reproduced `late`.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.events import Heartbeat, LeaderChanged
from core.reducer import apply
from core.state import ClusterState
from replay.explain import LoggedEvent, summarize

DecideFn = Callable[[ClusterState, float], Sequence[Any]]  # -> events (or objects with .event)

# Events a controller writes that are not outputs of decide().
NOT_DECISIONS = (LeaderChanged, Heartbeat)
LOOK_BACK = 64  # folds before a decision it may have been made on


@dataclass
class Mismatch:
    seq: int
    logged: str
    would_decide: list[str]

    def render(self) -> str:
        alt = "; ".join(self.would_decide) or "nothing"
        return f"seq {self.seq}: logged «{self.logged}» but the current code decides: {alt}"


@dataclass
class VerifyReport:
    checked: int = 0
    verified: int = 0
    unverifiable: int = 0
    late: int = 0  # of `verified`: made on a fold that had not reached what landed just before it
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.mismatches


def _event_of(decision: Any) -> Any:
    return getattr(decision, "event", decision)


def is_decision(ev: Any) -> bool:
    return ev.source.startswith("controller") and not isinstance(ev, NOT_DECISIONS)


def depends_on_heartbeats(ev: Any) -> bool:
    reason = getattr(ev.data, "reason", "") or ""
    return "heartbeat" in reason


def verify(
    records: Sequence[LoggedEvent], decide: DecideFn, state: ClusterState | None = None
) -> VerifyReport:
    """Check every logged controller decision against `decide` on the state before it (or on
    a fold the leader may have decided on, see the module's docstring)."""
    s = state if state is not None else ClusterState()
    report = VerifyReport()
    cache_seq = -1
    cache: set[str] = set()
    cache_text: list[str] = []
    folds: collections.deque[tuple[int, ClusterState]] = collections.deque(maxlen=LOOK_BACK)
    batch_key: tuple[str, float] | None = None
    batch_base: list[tuple[int, ClusterState]] = []  # the folds before the batch began
    batch: list[tuple[Any, int]] = []  # its decisions so far, with their sequences
    for rec in records:
        ev = rec.event
        if is_decision(ev):
            if (ev.source, ev.ts) != batch_key:
                batch_key, batch_base, batch = (ev.source, ev.ts), list(folds), []
            report.checked += 1
            if depends_on_heartbeats(ev):
                report.unverifiable += 1
            else:
                # decide is level-based: after the first decision of a tick is folded, the
                # rest are still what it answers on the new state. Ask once per state.
                key = hash((s.last_seq, ev.ts))
                if key != cache_seq:
                    out = [_event_of(d) for d in decide(s, ev.ts)]
                    cache = {e.id for e in out}
                    cache_text = [summarize(e) for e in out]
                    cache_seq = key
                if ev.id in cache:
                    report.verified += 1
                elif _on_an_earlier_fold(ev, batch_base, batch, decide):
                    report.verified += 1
                    report.late += 1
                else:
                    report.mismatches.append(Mismatch(rec.seq, summarize(ev), cache_text))
            batch.append((ev, rec.seq))
        else:
            batch_key = None
        s = apply(s, ev, 0 if isinstance(ev, Heartbeat) else rec.seq)
        folds.append((rec.seq, s))
    return report


def _on_an_earlier_fold(
    ev: Any, base: list[tuple[int, ClusterState]], batch: list[tuple[Any, int]], decide: DecideFn
) -> bool:
    """Whether `decide` gives `ev` on a fold before its batch (back to its cause), with the
    batch's decisions before it folded on top."""
    cause = ev.caused_by.seq if ev.caused_by is not None and ev.caused_by.seq else 0
    for seq, folded in reversed(base[:-1]):  # the last one is the state just before: tried
        if seq < cause:
            break
        for d, dseq in batch:
            folded = apply(folded, d, dseq)
        if any(_event_of(d).id == ev.id for d in decide(folded, ev.ts)):
            return True
    return False
