"""Reducer handlers for what nodes say of themselves: registration, heartbeats, endpoint
statuses, snapshot checkpoints."""

from __future__ import annotations

from core.events import (
    EndpointStatus,
    EndpointStatusChanged,
    Heartbeat,
    NodeDeregistered,
    NodeRegistered,
    NodeRegisteredData,
    SnapshotCheckpoint,
)
from core.fastreplace import replace
from core.handlers import Changes, handles
from core.state import ClusterState, NodeRecord, SnapshotRecord


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
