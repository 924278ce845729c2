"""Reducer handlers for instances: assembled, restated, their state changes, and the
external instances seed 001's refresh API declares."""

from __future__ import annotations

from typing import Any

import immutables

from core.bounds import UINT64_MAX
from core.events import (
    InstanceAssembled,
    InstanceRestated,
    InstancesRefreshed,
    InstanceState,
    InstanceStateChanged,
)
from core.fastreplace import replace
from core.handlers import Changes, handles
from core.state import ClusterState, InstanceRecord


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
        ops = s.ops
        if d.instance_id in ops.drains:  # drained (or replaced while draining): over
            ops = replace(ops, drains=ops.drains.delete(d.instance_id))
        return dict(
            instances=s.instances.delete(d.instance_id),
            nodes=nodes,
            alarms=alarms,
            ops=ops,
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
