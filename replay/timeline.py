"""`motor replay --timeline incident.html`: one self-contained page of lanes over time.

Instance and endpoint states are lanes of coloured segments; faults, precision alarms,
commands and leader changes are marks on lanes of their own. Inline SVG and CSS only (no
CDN, no script), so the page opens offline and attaches to a bug report as one file.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from core.events import (
    CircuitChanged,
    CircuitChangedData,
    CommandApplied,
    CommandRefused,
    EndpointStatusChanged,
    FaultCleared,
    FaultReported,
    Heartbeat,
    InstanceAssembled,
    InstanceRestated,
    InstanceStateChanged,
    LeaderChanged,
    PrecisionAlarmCleared,
    PrecisionAlarmRaised,
    StartCommand,
    StopCommand,
    StreamsDisrupted,
    StreamsDisruptedData,
)
from core.requestlog import RequestRecorded
from replay.explain import LoggedEvent, fmt_time, summarize

COLORS = {
    "INITIAL": "#9ecae1",
    "ACTIVE": "#31a354",
    "INACTIVE": "#fdae6b",
    "DEGRADED": "#fd8d3c",
    "ISOLATED": "#e6550d",
    "RECOVERING": "#6baed6",
    "TERMINATED": "#636363",
    "STARTING": "#9ecae1",
    "READY": "#31a354",
    "ABNORMAL": "#fd8d3c",
    "DEAD": "#de2d26",
    "STOPPED": "#bdbdbd",
    "CIRCUIT_OPEN": "#a50f15",
    "CIRCUIT_CLOSED": "#c7e9c0",
}
MARK_COLORS = {
    "fault": "#de2d26",
    "alarm": "#756bb1",
    "command": "#3182bd",
    "leader": "#000000",
    "streams": "#e6550d",
    "request": "#8c6d31",
}

LABEL_W = 200
PLOT_W = 1000
LANE_H = 24
TOP = 40


@dataclass
class Lane:
    key: str
    label: str
    kind: str  # instance | endpoint | circuit | streams | fault | alarm | command | leader | request
    changes: list[tuple[float, str, str]] = field(default_factory=list)  # (ts, state, detail)
    marks: list[tuple[float, str]] = field(default_factory=list)  # (ts, title)


def build_lanes(records: Sequence[LoggedEvent]) -> tuple[list[Lane], float, float]:
    """Lanes from the log, and the time range they span."""
    lanes: dict[str, Lane] = {}

    def lane(key: str, label: str, kind: str) -> Lane:
        if key not in lanes:
            lanes[key] = Lane(key, label, kind)
        return lanes[key]

    t0, t1 = float("inf"), float("-inf")
    for rec in records:
        ev = rec.event
        if isinstance(ev, Heartbeat):
            continue
        t0, t1 = min(t0, ev.ts), max(t1, ev.ts)
        title = f"{fmt_time(ev.ts)} seq {rec.seq}: {summarize(ev)}"
        match ev:
            case InstanceAssembled(data=d):
                lane(
                    f"instance-{d.instance_id}", f"instance {d.instance_id} ({d.role})", "instance"
                ).changes.append((ev.ts, "INITIAL", title))
            case InstanceRestated(data=d):
                lane(
                    f"instance-{d.instance_id}", f"instance {d.instance_id} ({d.spec.role})", "instance"
                ).changes.append((ev.ts, str(d.state), title))
            case InstanceStateChanged(data=d):
                lane(f"instance-{d.instance_id}", f"instance {d.instance_id}", "instance").changes.append(
                    (ev.ts, str(d.state), title)
                )
            case EndpointStatusChanged(data=d):
                lane(
                    f"endpoint-{d.node_id}-{d.endpoint_id}",
                    f"endpoint {d.node_id}/{d.endpoint_id}",
                    "endpoint",
                ).changes.append((ev.ts, str(d.status), title))
            case FaultReported() | FaultCleared():
                lane("marks-fault", "faults", "fault").marks.append((ev.ts, title))
            case PrecisionAlarmRaised() | PrecisionAlarmCleared():
                lane("marks-alarm", "precision alarms", "alarm").marks.append((ev.ts, title))
            case StartCommand() | StopCommand() | CommandApplied() | CommandRefused():
                lane("marks-command", "commands", "command").marks.append((ev.ts, title))
            case LeaderChanged():
                lane("marks-leader", "leader changes", "leader").marks.append((ev.ts, title))
            case CircuitChanged(data=d):
                # Beside its endpoint's lane: the coordinator's view of the engine under its facts.
                lane(
                    f"{_endpoint_lane(d)}-circuit", f"circuit {d.endpoint} ({d.coordinator})", "circuit"
                ).changes.append((ev.ts, f"CIRCUIT_{d.state.upper()}", title))
            case StreamsDisrupted(data=d):
                lane(
                    f"{_endpoint_lane(d)}-streams", f"streams {d.endpoint} ({d.coordinator})", "streams"
                ).marks.append((ev.ts, title))
            case RequestRecorded(data=d):
                # MOTOR_REQ's records (`motor replay --request ID` for the whole of one).
                lane("marks-request", "requests (routing records)", "request").marks.append((ev.ts, title))
    if t0 == float("inf"):
        t0 = t1 = 0.0
    # Endpoint, circuit and stream lanes share a rank so an endpoint's lanes sort together.
    order = {
        "instance": 0,
        "endpoint": 1,
        "circuit": 1,
        "streams": 1,
        "fault": 2,
        "alarm": 3,
        "command": 4,
        "leader": 5,
        "request": 6,
    }
    ordered = sorted(lanes.values(), key=lambda ln: (order[ln.kind], ln.key))
    return ordered, t0, t1


def _endpoint_lane(d: CircuitChangedData | StreamsDisruptedData) -> str:
    """The key of the endpoint lane a coordinator event belongs beside."""
    if d.node_id is not None and d.endpoint_id is not None:
        return f"endpoint-{d.node_id}-{d.endpoint_id}"
    return "endpoint-" + d.endpoint.replace("/", "-")


def render_html(records: Sequence[LoggedEvent], title: str = "Motor incident timeline") -> str:
    """The whole page as a string."""
    lanes, t0, t1 = build_lanes(records)
    span = max(t1 - t0, 1e-6)

    def x(ts: float) -> float:
        return LABEL_W + (ts - t0) / span * PLOT_W

    parts: list[str] = []
    height = TOP + LANE_H * len(lanes) + 30
    parts.append(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL_W + PLOT_W + 20}" height="{height}" '
        f'role="img" aria-label="timeline">'
    )
    for i in range(6):
        ts = t0 + span * i / 5
        xx = x(ts)
        parts.append(f'<line class="grid" x1="{xx:.1f}" y1="{TOP - 8}" x2="{xx:.1f}" y2="{height - 24}"/>')
        parts.append(f'<text class="tick" x="{xx:.1f}" y="{TOP - 12}">{html.escape(fmt_time(ts))}</text>')
    for idx, ln in enumerate(lanes):
        y = TOP + idx * LANE_H
        parts.append(f'<g class="lane lane-{ln.kind}" data-lane="{html.escape(ln.key)}">')
        parts.append(f'<text class="label" x="4" y="{y + LANE_H * 0.65:.1f}">{html.escape(ln.label)}</text>')
        changes = sorted(ln.changes)
        for j, (ts, state, detail) in enumerate(changes):
            end = changes[j + 1][0] if j + 1 < len(changes) else t1
            w = max(x(end) - x(ts), 2.0)
            color = COLORS.get(state, "#cccccc")
            parts.append(
                f'<rect class="seg state-{html.escape(state)}" x="{x(ts):.1f}" y="{y + 3}" width="{w:.1f}" '
                f'height="{LANE_H - 6}" fill="{color}"><title>{html.escape(detail)}</title></rect>'
            )
        for ts, mtitle in ln.marks:
            color = MARK_COLORS[ln.kind]
            parts.append(
                f'<rect class="mark mark-{ln.kind}" x="{x(ts) - 1.5:.1f}" y="{y + 2}" width="3" '
                f'height="{LANE_H - 4}" fill="{color}"><title>{html.escape(mtitle)}</title></rect>'
            )
        parts.append("</g>")
    parts.append("</svg>")
    legend = "".join(
        f'<span class="key"><i style="background:{c}"></i>{html.escape(s)}</span>' for s, c in COLORS.items()
    )
    when = datetime.fromtimestamp(t0, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if records else "empty log"
    seqs = f"seq {records[0].seq}–{records[-1].seq}" if records else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font: 13px system-ui, sans-serif; margin: 16px; color: #222; }}
h1 {{ font-size: 18px; margin: 0 0 4px; }}
.meta {{ color: #666; margin-bottom: 10px; }}
.label {{ font-size: 12px; fill: #222; }}
.tick {{ font-size: 11px; fill: #666; text-anchor: middle; }}
.grid {{ stroke: #e5e5e5; }}
.lane:nth-child(even) .label {{ fill: #444; }}
.key {{ display: inline-block; margin-right: 12px; }}
.key i {{ display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: middle; }}
</style></head>
<body>
<h1>{html.escape(title)}</h1>
<div class="meta">{html.escape(when)} · {html.escape(seqs)} · {len(lanes)} lanes · hover a segment or mark for the event</div>
<div class="legend">{legend}</div>
{"".join(parts)}
</body></html>
"""
