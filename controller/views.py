"""JSON views of the state for the observability API (pure functions, no I/O)."""

from __future__ import annotations

from typing import Any

from controller.state_queries import start_for
from core.state import ClusterState, InstanceRecord


def _load(state: ClusterState, node_id: str, endpoint_id: int) -> dict[str, Any] | None:
    node = state.nodes.get(node_id)
    if node is None:
        return None
    for load in node.load:
        if load.id == endpoint_id:
            return {
                "avail_slots": load.avail_slots,
                "avail_blocks": load.avail_blocks,
                "running": load.running,
                "waiting": load.waiting,
            }
    return None


def instance_view(state: ClusterState, inst: InstanceRecord) -> dict[str, Any]:
    """One instance as the model service list shows it: role, state, members, endpoints, load."""
    spec = inst.spec
    members = []
    for m in spec.members:
        node = state.nodes.get(m.node_id)
        cmd = start_for(node, inst.instance_id) if node is not None else None
        eps = []
        for ep in m.endpoints:
            status = node.endpoint_status.get(ep.id) if node is not None else None
            eps.append(
                {
                    "id": ep.id,
                    "ip": ep.ip,
                    "business_port": ep.business_port,
                    "mgmt_port": ep.mgmt_port,
                    "bootstrap_port": ep.bootstrap_port,
                    "status": status.value if status is not None else None,
                    "load": _load(state, m.node_id, ep.id),
                }
            )
        members.append(
            {
                "node_id": m.node_id,
                "node_rank": m.node_rank,
                "ip": m.ip,
                "registered": node is not None,
                "last_heartbeat": node.last_hb_ts if node is not None else None,
                "start_attempt": cmd.data.attempt if cmd is not None else None,
                "start_status": cmd.status if cmd is not None else None,
                "endpoints": eps,
            }
        )
    alarm = state.alarms.get(inst.instance_id)
    return {
        "id": inst.instance_id,
        "role": spec.role.value,
        "state": inst.state.value,
        "reason": inst.reason,
        "since": inst.state_ts,
        "model": spec.model,
        "engine_type": spec.engine_type,
        "job_name": spec.job_name,
        "master_dp_ip": spec.master_dp_ip,
        "d2d_peer_ips": list(spec.d2d_peer_ips),
        "capabilities": list(spec.capabilities),
        "assembled_seq": inst.assembled_seq,
        "precision_alarm": alarm.data.alarm_id if alarm is not None else None,
        "members": members,
    }


def instances_view(state: ClusterState) -> list[dict[str, Any]]:
    return [instance_view(state, state.instances[i]) for i in sorted(state.instances)]


def nodes_view(state: ClusterState) -> list[dict[str, Any]]:
    return [
        {
            "node_id": n.node_id,
            "role": n.reg.role.value,
            "ip": n.reg.pod_ip,
            "job_name": n.reg.job_name,
            "engine_type": n.reg.engine_type,
            "instance_id": n.instance_id,
            "last_heartbeat": n.last_hb_ts,
            "endpoints": {str(e): s.value for e, s in sorted(n.endpoint_status.items())},
        }
        for n in sorted(state.nodes.values(), key=lambda n: n.order)
    ]


def alarms_view(state: ClusterState) -> dict[str, Any]:
    """Open faults and precision alarms, oldest first."""
    faults = [
        {
            "fault_id": f.data.fault_id,
            "node_id": f.data.node_id,
            "level": f.data.level.value,
            "code": f.data.code,
            "message": f.data.message,
            "kind": f.data.kind,
            "instance_id": f.data.instance_id,
            "since": f.ts,
            "seq": f.seq,
        }
        for f in sorted(state.faults.values(), key=lambda f: f.seq)
    ]
    alarms = [
        {
            "alarm_id": a.data.alarm_id,
            "d_instance_id": a.data.d_instance_id,
            "p_instance_id": a.data.p_instance_id,
            "reason": a.data.reason,
            "detector": a.data.detector,
            "since": a.ts,
            "seq": a.seq,
        }
        for a in sorted(state.alarms.values(), key=lambda a: a.seq)
    ]
    return {"faults": faults, "precision_alarms": alarms}
