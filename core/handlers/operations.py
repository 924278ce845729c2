"""Reducer handlers for the operator's requests: drain, uncordon, scale, rolling restart."""

from __future__ import annotations

from core.events import (
    DrainRequested,
    InstanceState,
    RolloutCompleted,
    RolloutRequested,
    ScaleRequested,
    Uncordoned,
)
from core.fastreplace import replace
from core.handlers import Changes, handles
from core.opsstate import DrainRecord, RolloutRecord
from core.state import ClusterState


@handles(DrainRequested)
def _drain(s: ClusterState, ev: DrainRequested, seq: int) -> Changes:
    d = ev.data
    ops = s.ops
    iid = d.instance_id
    if d.target == "node":
        if d.node_id is None:
            return None
        if d.cordon:
            ops = replace(ops, cordoned=ops.cordoned | {d.node_id})
        node = s.nodes.get(d.node_id)
        iid = node.instance_id if node is not None else None
    inst = s.instances.get(iid) if iid is not None else None
    if (
        iid is not None
        and inst is not None
        and inst.state != InstanceState.TERMINATED
        and iid not in ops.drains
    ):
        # A second request for an instance already draining changes nothing: its clock runs on.
        rec = DrainRecord(d.drain_id, d.timeout, ev.ts, seq, ev.id, d.reason)
        ops = replace(ops, drains=ops.drains.set(iid, rec))
        roll = ops.rollouts.get(d.rollout_id) if d.rollout_id is not None else None
        if roll is not None and iid not in roll.replaced:
            roll = replace(roll, replaced=(*roll.replaced, iid))
            ops = replace(ops, rollouts=ops.rollouts.set(roll.rollout_id, roll))
    return None if ops is s.ops else dict(ops=ops)


@handles(Uncordoned)
def _uncordon(s: ClusterState, ev: Uncordoned, seq: int) -> Changes:
    if ev.data.node_id not in s.ops.cordoned:
        return None
    return dict(ops=replace(s.ops, cordoned=s.ops.cordoned - {ev.data.node_id}))


@handles(ScaleRequested)
def _scale(s: ClusterState, ev: ScaleRequested, seq: int) -> Changes:
    d = ev.data
    return dict(ops=replace(s.ops, scale=s.ops.scale.set(d.role.value, d.instances)))


@handles(RolloutRequested)
def _rollout(s: ClusterState, ev: RolloutRequested, seq: int) -> Changes:
    d = ev.data
    if d.rollout_id in s.ops.rollouts:
        return None
    rec = RolloutRecord(d.rollout_id, d.model, d.timeout, ev.ts, seq, ev.id)
    return dict(ops=replace(s.ops, rollouts=s.ops.rollouts.set(d.rollout_id, rec)))


@handles(RolloutCompleted)
def _rollout_done(s: ClusterState, ev: RolloutCompleted, seq: int) -> Changes:
    if ev.data.rollout_id not in s.ops.rollouts:
        return None
    return dict(ops=replace(s.ops, rollouts=s.ops.rollouts.delete(ev.data.rollout_id)))
