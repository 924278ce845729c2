"""`motor replay --explain`: the chain of events and decisions behind an entity's state.

Pure functions over logged records (anything with `seq`, `subject`, `event`). For an
instance or a node, list the events about it newest first; for each, follow `caused_by`
links back through the log ("isolated ← fault.reported L5 CardUnhealthy on n7, seq 812 ← …").
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from core.events import (
    AnyEvent,
    CircuitChanged,
    CircuitChangedData,
    CommandApplied,
    CommandRefused,
    EndpointStatusChanged,
    EventBase,
    FaultCleared,
    FaultReported,
    Heartbeat,
    InstanceAssembled,
    InstanceRestated,
    InstancesRefreshed,
    InstanceStateChanged,
    LeaderChanged,
    NodeDeregistered,
    NodeRegistered,
    PrecisionAlarmCleared,
    PrecisionAlarmRaised,
    SnapshotCheckpoint,
    StartCommand,
    StopCommand,
    StreamsDisrupted,
    StreamsDisruptedData,
)
from core.requestlog import RequestRecorded


class LoggedEvent(Protocol):
    """A decoded event and where it sits in the log (`streams.reader.Record` is one)."""

    @property
    def seq(self) -> int: ...

    @property
    def subject(self) -> str: ...

    @property
    def event(self) -> AnyEvent: ...


@dataclass(frozen=True, slots=True)
class ExplainLine:
    seq: int
    ts: float
    subject: str
    summary: str
    chain: tuple[str, ...]  # caused_by links, nearest first

    def render(self) -> str:
        head = f"{fmt_time(self.ts)}  seq {self.seq:<6} {self.subject:<32} {self.summary}"
        if not self.chain:
            return head
        return head + "\n" + "\n".join(f"{'':>12}← {link}" for link in self.chain)


def fmt_time(ts: float) -> str:
    """HH:MM:SS.d in UTC, the resolution an operator reads incidents at."""
    dt = datetime.fromtimestamp(ts, tz=UTC)
    return dt.strftime("%H:%M:%S.") + f"{dt.microsecond // 100_000}"


def summarize(ev: EventBase) -> str:
    """A one-line, human summary of an event."""
    if isinstance(ev, RequestRecorded):
        r = ev.data
        path = " → ".join(f"{a.endpoint} {a.outcome}" for a in r.attempts)
        return (
            f"request {r.request_id} ({', '.join(r.why)}): HTTP {r.status} after {r.took_ms:.0f} ms; {path}; "
            f"motor replay --request {r.request_id}"
        )
    match ev:
        case NodeRegistered(data=d):
            extra = " (restored)" if d.restored else ""
            return f"node {d.node_id} registered as {d.role} {d.engine_type} at {d.pod_ip}{extra}"
        case NodeDeregistered(data=d):
            return f"node {d.node_id} deregistered {d.reason}".rstrip()
        case Heartbeat(data=d):
            return f"heartbeat from {d.node_id}"
        case StartCommand(data=d):
            return f"start sent to {d.node_id} for instance {d.instance_id} (attempt {d.attempt}, rank {d.node_rank})"
        case StopCommand(data=d):
            return f"stop sent to {d.node_id} for instance {d.instance_id} {d.reason}".rstrip()
        case CommandApplied(data=d):
            return f"{d.verb} applied on {d.node_id}"
        case CommandRefused(data=d):
            return f"{d.verb} refused on {d.node_id}: {d.code} {d.reason}"
        case EndpointStatusChanged(data=d):
            why = f" ({d.reason})" if d.reason else ""
            code = f" exit {d.exit_code}" if d.exit_code is not None else ""
            return f"endpoint {d.node_id}/{d.endpoint_id} {d.previous or '-'} → {d.status}{why}{code}"
        case FaultReported(data=d):
            return f"fault.reported {d.level} {d.code} on {d.node_id}" + (
                f": {d.message}" if d.message else ""
            )
        case FaultCleared(data=d):
            return f"fault {d.fault_id} cleared on {d.node_id}"
        case PrecisionAlarmRaised(data=d):
            p = f" / p {d.p_instance_id}" if d.p_instance_id is not None else ""
            return f"precision alarm raised on d {d.d_instance_id}{p} by {d.detector}: {d.reason}"
        case PrecisionAlarmCleared(data=d):
            return f"precision alarm cleared on d {d.d_instance_id}"
        case SnapshotCheckpoint(data=d):
            return f"snapshot {d.phase} on {d.node_id}"
        case InstanceAssembled(data=d):
            nodes = ",".join(m.node_id for m in d.members)
            return f"instance {d.instance_id} assembled ({d.role}, {d.engine_type}) on {nodes}"
        case InstanceRestated(data=d):
            nodes = ",".join(m.node_id for m in d.spec.members)
            return f"instance {d.instance_id} restated ({d.spec.role}, {d.state}) on {nodes}"
        case InstanceStateChanged(data=d):
            why = f" ({d.reason})" if d.reason else ""
            return f"instance {d.instance_id} {d.previous or '-'} → {d.state}{why}"
        case LeaderChanged(data=d):
            return f"leader {d.previous or '-'} → {d.leader_id} (term {d.term})"
        case InstancesRefreshed(data=d):
            return f"instances refreshed ({d.event}): {list(d.ids)}"
        case CircuitChanged(data=d):
            return _circuit(d)
        case StreamsDisrupted(data=d):
            return _streams(d)
    return str(getattr(ev, "type", type(ev).__name__))


def _circuit(d: CircuitChangedData) -> str:
    inc = f"pid {d.pid}" if d.pid is not None else (f"READY seq {d.ready_seq}" if d.ready_seq else "")
    inc = f", incarnation {inc}" if inc else ""
    if d.state == "open":
        return (
            f"circuit of {d.endpoint} opened by {d.coordinator} for {d.backoff_s:g} s after "
            f"{d.failures} failures{inc}: {d.reason}"
        )
    return f"circuit of {d.endpoint} closed by {d.coordinator}{inc}: {d.reason}"


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} ×{n}" for k, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _streams(d: StreamsDisruptedData) -> str:
    parts = []
    if d.broken:
        why = f" ({_counts(d.reasons)})" if d.reasons and not d.retried else ""
        on = f" on {_counts(d.continued_on)}" if d.continued_on else ""
        parts.append(f"{d.broken} streams broke{why}: {d.continued} continued{on}, {d.failed} failed")
    elif d.continued or d.failed:
        on = f" on {_counts(d.continued_on)}" if d.continued_on else ""
        parts.append(f"{d.continued} broken streams continued{on}, {d.failed} failed")
    if d.retried:
        why = f" ({_counts(d.reasons)})" if d.reasons else ""
        parts.append(f"{d.retried} requests retried elsewhere before their first byte{why}")
    return f"{d.endpoint} via {d.coordinator} over {d.until - d.since:.1f} s: " + "; ".join(parts)


def concerns(ev: EventBase, kind: str, entity: str) -> bool:
    """Whether an event is about the instance or node named."""
    d = getattr(ev, "data", None)
    if kind == "instance":
        iid = int(entity)
        if getattr(d, "instance_id", None) == iid:
            return True
        if isinstance(ev, PrecisionAlarmRaised | PrecisionAlarmCleared):
            return iid in (ev.data.d_instance_id, ev.data.p_instance_id)
        return False
    if kind == "node":
        if getattr(d, "node_id", None) == entity:
            return True
        if isinstance(ev, InstanceAssembled):
            return any(m.node_id == entity for m in ev.data.members)
        if isinstance(ev, InstanceRestated):
            return any(m.node_id == entity for m in ev.data.spec.members)
        return False
    raise ValueError(f"unknown entity kind {kind!r} (use instance or node)")


def explain(
    records: Sequence[LoggedEvent], kind: str, entity: str, *, limit: int = 50, max_depth: int = 8
) -> list[ExplainLine]:
    """Events about the entity, newest first, each with its `caused_by` chain."""
    by_seq = {r.seq: r for r in records}
    by_id = {r.event.id: r for r in records}
    lines: list[ExplainLine] = []
    for rec in reversed(records):
        ev = rec.event
        if isinstance(ev, Heartbeat) or not concerns(ev, kind, entity):
            continue
        lines.append(
            ExplainLine(rec.seq, ev.ts, rec.subject, summarize(ev), _chain(ev, by_seq, by_id, max_depth))
        )
        if len(lines) >= limit:
            break
    return lines


def _chain(ev: Any, by_seq: dict[int, Any], by_id: dict[str, Any], max_depth: int) -> tuple[str, ...]:
    links: list[str] = []
    seen: set[str] = {ev.id}
    cur = ev
    while cur.caused_by is not None and len(links) < max_depth:
        cb = cur.caused_by
        rec = by_seq.get(cb.seq) if cb.seq is not None else None
        if rec is None or rec.event.id != cb.id:
            rec = by_id.get(cb.id)
        if rec is None:
            where = f"seq {cb.seq}" if cb.seq is not None else f"id {cb.id}"
            links.append(f"{where} (not in this log range)")
            break
        if rec.event.id in seen:
            break
        seen.add(rec.event.id)
        links.append(f"{summarize(rec.event)}, seq {rec.seq} at {fmt_time(rec.event.ts)}")
        cur = rec.event
    return tuple(links)


def render(lines: Iterable[ExplainLine]) -> str:
    return "\n".join(line.render() for line in lines)
