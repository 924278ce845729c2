"""`motor replay --verify`: re-run a decide function over the log, report what differs.

For every decision the controller logged, fold the log up to just before it and ask the
current code's `decide(state, now=decision.ts)` whether it would make the same decision (same
derived id). A decision it would not make is nondeterminism or version drift. Decisions that
answer heartbeat silence cannot be re-derived (heartbeats are not kept in the log) and are
counted apart.
"""

from __future__ import annotations

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
    """Check every logged controller decision against `decide` on the state before it."""
    s = state if state is not None else ClusterState()
    report = VerifyReport()
    cache_seq = -1
    cache: set[str] = set()
    cache_text: list[str] = []
    for rec in records:
        ev = rec.event
        if is_decision(ev):
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
                else:
                    report.mismatches.append(Mismatch(rec.seq, summarize(ev), cache_text))
        s = apply(s, ev, 0 if isinstance(ev, Heartbeat) else rec.seq)
    return report
