"""apply(state, event) -> state: the pure fold every component and the replay tool share.

No clock reads: time comes from `event.ts`. Events about unknown entities are no-ops (a
heartbeat before its registration, a command for a node that left), never errors, so a
replay of any log prefix succeeds. Handlers are total over what the codec accepts: a
decodable event never raises here (the folds still guard `apply` and count what does as
`inapplicable`, so a bug here costs one event, not the fold).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import immutables

from core.bounds import UINT64_MAX
from core.eventdata import STALE_TERM
from core.events import (
    ALL_EVENTS,
    CircuitChanged,
    CommandApplied,
    CommandRefused,
    EndpointStatus,
    EndpointStatusChanged,
    EventBase,
    FaultCleared,
    FaultReported,
    Heartbeat,
    InstanceAssembled,
    InstanceRestated,
    InstancesRefreshed,
    InstanceState,
    InstanceStateChanged,
    LeaderChanged,
    NodeDeregistered,
    NodeRegistered,
    NodeRegisteredData,
    PrecisionAlarmCleared,
    PrecisionAlarmRaised,
    SnapshotCheckpoint,
    StartCommand,
    StopCommand,
    StreamsDisrupted,
)
from core.fastreplace import replace
from core.state import (
    AlarmRecord,
    ClusterState,
    CommandRecord,
    FaultRecord,
    InstanceRecord,
    NodeRecord,
    SnapshotRecord,
)

# A handler returns the fields of the state it changes (None: the event changes nothing);
# `apply` makes the one copy of the state per event.
Changes = dict[str, Any] | None
Handler = Callable[[ClusterState, Any, int], Changes]
H = TypeVar("H", bound=Handler)

# event class -> its handler; filled by `handles`, checked complete below.
HANDLERS: dict[type[EventBase], Handler] = {}


def handles(*classes: type[EventBase]) -> Callable[[H], H]:
    """Declare `fn` the handler of events of `classes` (one handler a class)."""

    def deco(fn: H) -> H:
        for cls in classes:
            if cls in HANDLERS:
                raise TypeError(f"{cls.__name__} has two handlers: {HANDLERS[cls].__name__}, {fn.__name__}")
            HANDLERS[cls] = fn
        return fn

    return deco


@handles(NodeRegistered)
def _node_registered(s: ClusterState, ev: NodeRegistered, seq: int) -> Changes:
    d = ev.data
    old = s.nodes.get(d.node_id)
    if old is None:
        order, next_order = s.next_order, s.next_order + 1
        instance_id = d.instance_id
    else:
        order, next_order = old.order, s.next_order
        instance_id = d.instance_id
        if instance_id is None and old.instance_id is not None:
            # The node restarted without engines but its instance still counts on it: keep
            # the assignment so the node is not handed to another instance; the controller
            # restarts it there.
            inst = s.instances.get(old.instance_id)
            if inst is not None and d.node_id in inst.node_ids:
                instance_id = old.instance_id
    if d.restated and old is not None and _same_node(old.reg, d):
        # Said again against age-out, by a node the fold knows as it is: nothing changes (its
        # endpoints' statuses, commands and registration order stand; no restart is owed).
        return None
    running = {e: EndpointStatus.STARTING for e in d.running_endpoints}
    rec = NodeRecord(
        reg=d,
        order=order,
        registered_ts=ev.ts,
        registered_seq=seq,
        instance_id=instance_id,
        endpoint_status=running,
        endpoint_reason={},
        last_hb_ts=ev.ts,
        load=(),
        start_cmd=old.start_cmd if old else None,
        stop_cmd=old.stop_cmd if old else None,
        endpoint_seq={e: seq for e in running},
        endpoint_event_id={e: ev.id for e in running},
        registered_id=ev.id,
    )
    return dict(nodes=s.nodes.set(d.node_id, rec), next_order=next_order)


def _same_node(known: NodeRegisteredData, said: NodeRegisteredData) -> bool:
    """Whether a restated registration names the node the fold knows (what it runs aside: the
    fold follows that from commands and statuses since the registration it holds)."""
    ignore = {"instance_id", "running_endpoints", "restated"}
    return known.model_dump(exclude=ignore) == said.model_dump(exclude=ignore)


@handles(NodeDeregistered)
def _node_deregistered(s: ClusterState, ev: NodeDeregistered, seq: int) -> Changes:
    if ev.data.node_id not in s.nodes:
        return None
    return dict(nodes=s.nodes.delete(ev.data.node_id))


@handles(Heartbeat)
def _heartbeat(s: ClusterState, ev: Heartbeat, seq: int) -> Changes:
    node = s.nodes.get(ev.data.node_id)
    if node is None:
        return None
    return dict(
        nodes=s.nodes.set(
            node.node_id, replace(node, last_hb_ts=ev.ts, load=ev.data.endpoints, last_hb_id=ev.id)
        ),
    )


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


@handles(EndpointStatusChanged)
def _endpoint_status(s: ClusterState, ev: EndpointStatusChanged, seq: int) -> Changes:
    d = ev.data
    node = s.nodes.get(d.node_id)
    if node is None:
        return None
    status = dict(node.endpoint_status)
    status[d.endpoint_id] = d.status
    reason = dict(node.endpoint_reason)
    reason[d.endpoint_id] = d.reason
    eseq = dict(node.endpoint_seq)
    eseq[d.endpoint_id] = seq
    eid = dict(node.endpoint_event_id)
    eid[d.endpoint_id] = ev.id
    node = replace(
        node, endpoint_status=status, endpoint_reason=reason, endpoint_seq=eseq, endpoint_event_id=eid
    )
    return dict(nodes=s.nodes.set(d.node_id, node))


@handles(FaultReported)
def _fault_reported(s: ClusterState, ev: FaultReported, seq: int) -> Changes:
    rec = FaultRecord(ev.data, ev.ts, seq, ev.id)
    return dict(faults=s.faults.set(ev.data.fault_id, rec))


@handles(FaultCleared)
def _fault_cleared(s: ClusterState, ev: FaultCleared, seq: int) -> Changes:
    if ev.data.fault_id not in s.faults:
        return None
    return dict(faults=s.faults.delete(ev.data.fault_id))


@handles(PrecisionAlarmRaised)
def _alarm_raised(s: ClusterState, ev: PrecisionAlarmRaised, seq: int) -> Changes:
    rec = AlarmRecord(ev.data, ev.ts, seq, ev.id)
    return dict(alarms=s.alarms.set(ev.data.d_instance_id, rec))


@handles(PrecisionAlarmCleared)
def _alarm_cleared(s: ClusterState, ev: PrecisionAlarmCleared, seq: int) -> Changes:
    if ev.data.d_instance_id not in s.alarms:
        return None
    return dict(alarms=s.alarms.delete(ev.data.d_instance_id))


@handles(SnapshotCheckpoint)
def _snapshot(s: ClusterState, ev: SnapshotCheckpoint, seq: int) -> Changes:
    d = ev.data
    old = s.snapshots.get(d.node_id)
    rec = SnapshotRecord(
        phase=d.phase,
        ts=ev.ts,
        instance_id=d.instance_id if d.instance_id is not None else (old.instance_id if old else None),
        job_name=d.job_name if d.job_name is not None else (old.job_name if old else None),
        seq=seq,
        event_id=ev.id,
    )
    return dict(snapshots=s.snapshots.set(d.node_id, rec))


@handles(InstanceAssembled)
def _assembled(s: ClusterState, ev: InstanceAssembled, seq: int) -> Changes:
    d = ev.data
    rec = InstanceRecord(
        spec=d,
        state=InstanceState.INITIAL,
        state_ts=ev.ts,
        assembled_ts=ev.ts,
        assembled_seq=seq,
        assembled_id=ev.id,
    )
    nodes = s.nodes
    for m in d.members:
        node = nodes.get(m.node_id)
        if node is not None:
            nodes = nodes.set(m.node_id, replace(node, instance_id=d.instance_id))
    return dict(
        instances=s.instances.set(d.instance_id, rec),
        nodes=nodes,
        next_instance_id=max(s.next_instance_id, d.instance_id + 1),
    )


@handles(InstanceRestated)
def _restated(s: ClusterState, ev: InstanceRestated, seq: int) -> Changes:
    d = ev.data
    iid = d.instance_id
    known = s.instances.get(iid)
    if known is not None:
        # The fold holds the facts restated: only note when they were said again.
        return dict(instances=s.instances.set(iid, replace(known, restated_ts=ev.ts)))
    if iid in s.retired or d.spec.instance_id != iid:
        return None  # terminated since (or a malformed restatement): nothing to learn
    # A fold that starts after the original facts aged out learns the instance here, in the
    # state it was restated in.
    active = d.active_ts > 0
    rec = InstanceRecord(
        spec=d.spec,
        state=d.state,
        state_ts=d.state_ts,
        assembled_ts=d.assembled_ts,
        assembled_seq=seq,
        reason=d.reason,
        assembled_id=ev.id,
        active_seq=seq if active else 0,
        active_ts=d.active_ts,
        restated_ts=ev.ts,
    )
    nodes = s.nodes
    for m in d.spec.members:
        node = nodes.get(m.node_id)
        if node is not None:
            nodes = nodes.set(m.node_id, replace(node, instance_id=iid))
    return dict(
        instances=s.instances.set(iid, rec),
        nodes=nodes,
        next_instance_id=max(s.next_instance_id, iid + 1),
    )


@handles(InstanceStateChanged)
def _state_changed(s: ClusterState, ev: InstanceStateChanged, seq: int) -> Changes:
    d = ev.data
    inst = s.instances.get(d.instance_id)
    if inst is None:
        return None
    if d.state == InstanceState.TERMINATED:
        nodes = s.nodes
        for nid in inst.node_ids:
            node = nodes.get(nid)
            if node is not None and node.instance_id == d.instance_id:
                nodes = nodes.set(nid, replace(node, instance_id=None, start_cmd=None))
        alarms = s.alarms
        if d.instance_id in alarms:
            alarms = alarms.delete(d.instance_id)
        return dict(
            instances=s.instances.delete(d.instance_id),
            nodes=nodes,
            alarms=alarms,
            retired=s.retired | {d.instance_id},
        )
    active = d.state == InstanceState.ACTIVE
    rec = replace(
        inst,
        state=d.state,
        state_ts=ev.ts,
        reason=d.reason,
        active_seq=seq if active else inst.active_seq,
        active_ts=ev.ts if active else inst.active_ts,
    )
    return dict(instances=s.instances.set(d.instance_id, rec))


@handles(LeaderChanged)
def _leader(s: ClusterState, ev: LeaderChanged, seq: int) -> Changes:
    return dict(leader=ev.data, leader_ts=ev.ts)


def _ext_id(raw: Any) -> int | None:
    """An external instance's id, or None when it has none usable (the entry is then ignored).

    Seed 001's ids are uint64, as the refresh API checks; anyone else's entry may say anything.
    """
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        number = raw
    # isdigit() alone takes '¹' or '٣', which int() refuses: ASCII digits only.
    elif isinstance(raw, str) and (digits := raw.strip()).isascii() and digits.isdigit():
        number = int(digits)
    else:
        return None
    return number if 0 <= number <= UINT64_MAX else None


@handles(InstancesRefreshed)
def _refreshed(s: ClusterState, ev: InstancesRefreshed, seq: int) -> Changes:
    # Any client with publish rights can write this event, and the coordinator validated only
    # what it wrote itself: an entry without a usable id is ignored, never a KeyError that
    # would stop every fold of the log at this sequence.
    d = ev.data
    given = {i: e for e in d.instances if (i := _ext_id(e.get("id"))) is not None}
    if d.event == "set":
        external: immutables.Map[int, dict[str, Any]] = immutables.Map(given)
    elif d.event == "add":
        external = s.external.update(given)
    else:
        with s.external.mutate() as m:
            for i in d.ids:
                m.pop(int(i), None)
            external = m.finish()
    return dict(external=external)


@handles(CircuitChanged, StreamsDisrupted)
def _routing_fact(s: ClusterState, ev: EventBase, seq: int) -> Changes:
    """A coordinator's circuit or stream outcome: history for `motor replay`, not lifecycle state."""
    return None


_unhandled = [cls.__name__ for cls in ALL_EVENTS if cls not in HANDLERS]
if _unhandled:  # a new event class without a handler would stop every fold at its first event
    raise TypeError(f"no reducer handler for {', '.join(_unhandled)}")


def apply(state: ClusterState, event: EventBase, seq: int = 0) -> ClusterState:
    """Return the state after `event` (at stream sequence `seq`, 0 when unknown)."""
    changes = HANDLERS[type(event)](state, event, seq)
    if changes is None:
        changes = {}
    changes["last_seq"] = max(state.last_seq, seq)
    changes["last_ts"] = max(state.last_ts, event.ts)
    changes["events_applied"] = state.events_applied + 1
    return replace(state, **changes)


def fold(events: Iterable[tuple[int, EventBase]], state: ClusterState | None = None) -> ClusterState:
    """Fold `(seq, event)` pairs into a state."""
    s = state if state is not None else ClusterState()
    for seq, ev in events:
        s = apply(s, ev, seq)
    return s
