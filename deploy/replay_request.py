"""`motor replay --request ID`: one request's routing record beside what the coordinator knew.

The record (`core.requestlog`) names the MOTOR position the coordinator had folded when the
request came; folding the log to it rebuilds the routing table the request was routed on, so
every endpoint of its model shows whether it was routable then and why not. The events after
that position about the endpoints its attempts touched, until it ended, are what made it
retry or move: an endpoint's health, its instance's state, a circuit another request opened.
Pure: records in, text out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coordinator.table import RoutingTable
from core.events import CircuitChanged, EndpointStatusChanged, InstanceStateChanged, StreamsDisrupted
from core.requestlog import RequestRecordData
from replay.explain import fmt_time, summarize

AFTER = 2.0  # seconds past the request's end whose events are still shown (they may explain it)


def _node(key: str) -> str:
    return key.rpartition("/")[0] if not key.startswith("ext/") else key


def render_request(rec: RequestRecordData, records: Sequence[Any]) -> str:
    """The record, the table it was routed on, and the events that touched its endpoints."""
    out = [
        f"request {rec.request_id}"
        + (f" (x-request-id {rec.client_id})" if rec.client_id else "")
        + f" on coordinator {rec.coordinator}",
        f"  {rec.route} model={rec.model} stream={str(rec.stream).lower()} at {fmt_time(rec.started)}: "
        f"HTTP {rec.status or '— (client gone)'} after {rec.took_ms:.0f} ms"
        + (f", first byte after {rec.ttft_ms:.0f} ms" if rec.ttft_ms is not None else "")
        + f"; {rec.ended}",
        f"  recorded because: {', '.join(rec.why)}; routed on the log at seq {rec.log_seq}",
        "",
        "attempts:",
    ]
    touched: set[str] = set()
    for a in rec.attempts:
        path = f"{a.prefill} -> {a.endpoint} via {a.capability}" if a.prefill else a.endpoint
        touched.update(k for k in (a.endpoint, a.prefill) if k)
        when = (
            f"{a.started_ms:.0f}–{a.ended_ms:.0f} ms" if a.ended_ms is not None else f"{a.started_ms:.0f} ms–"
        )
        out.append(f"  #{a.number}{' (hedge)' if a.hedge else ''} {path}  [{when}]  {a.outcome}")
        if a.detail:
            out.append(f"      {a.detail}")
        if a.candidates:
            among = ", ".join(f"{c.endpoint} ({c.role}) load {c.load}" for c in a.candidates)
            out.append(f"      among: {among}")
        if a.excluded:
            out.append(f"      excluded (failed this request): {', '.join(a.excluded)}")
    table = RoutingTable()
    after: list[Any] = []
    end = rec.started + rec.took_ms / 1000 + AFTER
    nodes = {_node(k) for k in touched}
    for r in records:
        if r.seq <= rec.log_seq:
            table.apply(r.event, r.seq)
        elif r.event.ts <= end and _about(r.event, nodes):
            after.append(r)
    out += ["", f"what the coordinator knew at seq {rec.log_seq} (model {rec.model}):"]
    rows = [row for row in table.describe() if rec.model is None or row["model"] == rec.model]
    if not rows:
        out.append("  no endpoint of this model (the log may have aged out past this position)")
    for row in rows:
        state = "routable" if row["routable"] else f"not routable: {row['reason']}"
        out.append(f"  {row['key']:<24} {row['role']:<8} {state}")
    out += ["", "events about its endpoints while it ran (what made it retry or move):"]
    if not after:
        out.append("  none in MOTOR (a hedge, a timeout or a transport error needs no event)")
    for r in after:
        out.append(f"  seq {r.seq:>7}  {fmt_time(r.event.ts)}  {summarize(r.event)}")
    return "\n".join(out)


def _about(ev: Any, nodes: set[str]) -> bool:
    if isinstance(ev, EndpointStatusChanged):
        return ev.data.node_id in nodes
    if isinstance(ev, CircuitChanged | StreamsDisrupted):
        return _node(ev.data.endpoint) in nodes
    return isinstance(ev, InstanceStateChanged)
