"""Read-only questions `decide` asks of a `ClusterState` (no I/O, no clock)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.events import EndpointStatus, FaultLevel, Role
from core.state import (
    AlarmRecord,
    ClusterState,
    CommandRecord,
    FaultRecord,
    InstanceRecord,
    NodeRecord,
    StartRecord,
)

# Restart the engines in place (isolate, stop, start); the instance keeps its nodes.
RESTART_LEVELS = frozenset({FaultLevel.L3, FaultLevel.L4})
# Replace: the instance is terminated and reassembled from healthy free nodes; the node stays
# out of assembly until its fault is cleared.
REPLACE_LEVELS = frozenset({FaultLevel.L5, FaultLevel.L6})
# Faults the controller raises itself and clears when the node registers again.
START_EXHAUSTED = "StartRetriesExhausted"


def start_for(node: NodeRecord, instance_id: int) -> StartRecord | None:
    """The node's latest start command if it was for this instance."""
    cmd = node.start_cmd
    if cmd is None or cmd.data.instance_id != instance_id:
        return None
    return cmd


def start_endpoint_ids(cmd: StartRecord) -> tuple[int, ...]:
    return tuple(e.id for e in cmd.data.endpoints)


def ready_since(node: NodeRecord, cmd: StartRecord) -> bool:
    """Every endpoint the start named reported READY after that start."""
    ids = start_endpoint_ids(cmd)
    return bool(ids) and all(
        node.endpoint_status.get(e) == EndpointStatus.READY and node.endpoint_seq.get(e, 0) > cmd.seq
        for e in ids
    )


def statuses_since(node: NodeRecord, cmd: StartRecord) -> dict[int, EndpointStatus]:
    """Endpoint statuses reported after the start (older ones say nothing about it)."""
    return {
        e: node.endpoint_status[e]
        for e in start_endpoint_ids(cmd)
        if e in node.endpoint_status and node.endpoint_seq.get(e, 0) > cmd.seq
    }


def member_index(state: ClusterState) -> dict[str, int]:
    """node id -> the instance that lists it (the instance's member list is what counts)."""
    out: dict[str, int] = {}
    for iid in sorted(state.instances):
        for nid in state.instances[iid].node_ids:
            out.setdefault(nid, iid)
    return out


def fault_instance(
    state: ClusterState, member_of: dict[str, int], fault: FaultRecord
) -> InstanceRecord | None:
    """The instance a fault hits: the one listing its node, else (unknown node) the one it names."""
    iid = member_of.get(fault.data.node_id)
    if iid is not None:
        return state.instances[iid]
    if fault.data.node_id not in state.nodes and fault.data.instance_id is not None:
        # An operator may report a fault for an instance with a node id we do not know.
        return state.instances.get(fault.data.instance_id)
    return None


def stop_outstanding(node: NodeRecord) -> bool:
    """A stop sent since the node's registration has not been applied yet: pending, or refused
    as of an older leader term (it is sent again, `stop_again`) and no start came after it."""
    stop = node.stop_cmd
    if stop is None or stop.seq <= node.registered_seq:
        return False
    return stop.status == "pending" or (outranked(stop) > 0 and not started_after(node, stop.seq))


def started_after(node: NodeRecord, seq: int) -> bool:
    return node.start_cmd is not None and node.start_cmd.seq > seq


def outranked(cmd: CommandRecord[Any] | None) -> int:
    """The newer leader term the node had obeyed when it refused `cmd` (`stale_term`); 0 if
    it did not refuse it for that."""
    return cmd.outranked_by if cmd is not None and cmd.status == "refused" else 0


def outranking_term(state: ClusterState) -> int:
    """The newest leader term a node refused a latest command of ours for (0: none did).

    At or past the reign's own term, the leader must announce a newer reign: every command it
    sends would be refused (`controller.leadership`).
    """
    return max((outranked(c) for n in state.nodes.values() for c in (n.start_cmd, n.stop_cmd)), default=0)


def assemblable(state: ClusterState, node: NodeRecord, engine_type: str, idx: Index) -> bool:
    """Free, healthy, quiet: the node can join a new instance now."""
    if node.node_id in idx.member_of or node.node_id in idx.blocked or not node.reg.endpoints:
        return False
    if node.node_id in state.ops.cordoned:
        return False  # drained for maintenance: `motor uncordon` gives it back
    if node.reg.engine_type != engine_type or stop_outstanding(node):
        return False
    snap = state.snapshots.get(node.node_id)
    return not (snap is not None and snap.pending)


def blocked_nodes(state: ClusterState) -> set[str]:
    return {f.data.node_id for f in state.faults.values() if f.data.level in REPLACE_LEVELS}


def is_borrowed(state: ClusterState, inst: InstanceRecord) -> bool:
    """A decode instance built from prefill nodes by ScaleP2D."""
    if inst.spec.role != Role.DECODE:
        return False
    for nid in inst.node_ids:
        node = state.nodes.get(nid)
        if node is not None and node.reg.role == Role.PREFILL:
            return True
    return False


@dataclass(frozen=True, slots=True)
class Index:
    """Lookups `decide` needs many times, built once per call."""

    faults_by_instance: dict[int, list[FaultRecord]]
    orphan_faults: list[FaultRecord]  # faults that hit no instance
    alarms_by_instance: dict[int, list[AlarmRecord]]  # an alarm is filed under its d and its p
    blocked: set[str]  # nodes with an open replace-level fault
    member_of: dict[str, int]  # node id -> the instance listing it


def build_index(state: ClusterState) -> Index:
    member_of = member_index(state)
    by_inst: dict[int, list[FaultRecord]] = {}
    orphans: list[FaultRecord] = []
    for f in sorted(state.faults.values(), key=lambda f: f.seq):
        inst = fault_instance(state, member_of, f)
        if inst is None:
            orphans.append(f)
        else:
            by_inst.setdefault(inst.instance_id, []).append(f)
    alarms: dict[int, list[AlarmRecord]] = {}
    for a in sorted(state.alarms.values(), key=lambda a: a.seq):
        alarms.setdefault(a.data.d_instance_id, []).append(a)
        if a.data.p_instance_id is not None and a.data.p_instance_id != a.data.d_instance_id:
            alarms.setdefault(a.data.p_instance_id, []).append(a)
    return Index(by_inst, orphans, alarms, blocked_nodes(state), member_of)
