"""Reducer handlers for the controller's side of a node: its leadership, the start and stop
commands it sends, and what the node answers (applied or refused)."""

from __future__ import annotations

from typing import Any

from core.eventdata import STALE_TERM
from core.events import (
    CommandApplied,
    CommandRefused,
    EndpointStatus,
    LeaderChanged,
    StartCommand,
    StopCommand,
)
from core.fastreplace import replace
from core.handlers import Changes, handles
from core.state import ClusterState, CommandRecord


@handles(LeaderChanged)
def _leader(s: ClusterState, ev: LeaderChanged, seq: int) -> Changes:
    return dict(leader=ev.data, leader_ts=ev.ts)


@handles(StartCommand)
def _start(s: ClusterState, ev: StartCommand, seq: int) -> Changes:
    d = ev.data
    node = s.nodes.get(d.node_id)
    if node is None:
        return None
    rec = CommandRecord(d, ev.ts, seq)
    node = replace(node, start_cmd=rec, instance_id=d.instance_id)
    return dict(nodes=s.nodes.set(d.node_id, node))


@handles(StopCommand)
def _stop(s: ClusterState, ev: StopCommand, seq: int) -> Changes:
    d = ev.data
    node = s.nodes.get(d.node_id)
    if node is None:
        return None
    return dict(nodes=s.nodes.set(d.node_id, replace(node, stop_cmd=CommandRecord(d, ev.ts, seq))))


@handles(CommandApplied)
def _applied(s: ClusterState, ev: CommandApplied, seq: int) -> Changes:
    d = ev.data
    node = s.nodes.get(d.node_id)
    if node is None:
        return None
    if d.verb == "start":
        start = node.start_cmd
        if start is None or start.data.command_id != d.command_id:
            return None
        node = replace(node, start_cmd=replace(start, status="applied", status_ts=ev.ts))
        return dict(nodes=s.nodes.set(d.node_id, node))
    stop = node.stop_cmd
    if stop is None or stop.data.command_id != d.command_id:
        return None
    # The stop took effect: the endpoints it named (all of the node's if none) are STOPPED.
    ids = stop.data.endpoint_ids or tuple(e.id for e in node.reg.endpoints)
    status = dict(node.endpoint_status)
    eseq = dict(node.endpoint_seq)
    eid = dict(node.endpoint_event_id)
    for e in ids:
        status[e] = EndpointStatus.STOPPED
        eseq[e] = seq
        eid[e] = ev.id
    node = replace(
        node,
        stop_cmd=replace(stop, status="applied", status_ts=ev.ts),
        endpoint_status=status,
        endpoint_seq=eseq,
        endpoint_event_id=eid,
    )
    return dict(nodes=s.nodes.set(d.node_id, node))


@handles(CommandRefused)
def _refused(s: ClusterState, ev: CommandRefused, seq: int) -> Changes:
    d = ev.data
    node = s.nodes.get(d.node_id)
    if node is None:
        return None
    why: dict[str, Any] = dict(status="refused", reason=f"{d.code}: {d.reason}", status_ts=ev.ts)
    rec: CommandRecord[Any] | None = node.start_cmd if d.verb == "start" else node.stop_cmd
    if rec is None or rec.data.command_id != d.command_id:
        return None
    if d.code == STALE_TERM:
        # Newer than the command's, whatever the node says (an agent from before `seen_term`
        # says nothing more).
        why["outranked_by"] = max(d.seen_term or 0, rec.data.term + 1)
    rec = replace(rec, **why)
    node = replace(node, start_cmd=rec) if d.verb == "start" else replace(node, stop_cmd=rec)
    return dict(nodes=s.nodes.set(d.node_id, node))
