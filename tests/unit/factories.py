"""Builders of valid events for table tests (one place, so schema changes touch one file)."""

from __future__ import annotations

from core.events import (
    CausedBy,
    EndpointSpec,
    EndpointStatus,
    EndpointStatusChanged,
    EndpointStatusChangedData,
    InstanceAssembled,
    InstanceAssembledData,
    InstanceMember,
    NodeRegistered,
    NodeRegisteredData,
    Role,
    StartCommand,
    StartCommandData,
)
from core.ids import derive_id


def ep(i: int = 0, ip: str = "10.0.0.1", port: int = 9000) -> EndpointSpec:
    return EndpointSpec(id=i, ip=ip, business_port=port, mgmt_port=port)


def registered(
    node_id: str, role: Role | str = Role.UNION, ts: float = 1.0, ip: str = "10.0.0.1", **kw: object
) -> NodeRegistered:
    data = NodeRegisteredData(
        node_id=node_id,
        job_name=kw.pop("job_name", "motor"),  # type: ignore[arg-type]
        pod_ip=ip,
        role=Role(role),
        engine_type=kw.pop("engine_type", "builtin"),  # type: ignore[arg-type]
        model="motor-sim",
        endpoints=(ep(0, ip),),
        **kw,  # type: ignore[arg-type]
    )
    return NodeRegistered(id=derive_id("reg", node_id, ts), ts=ts, source=f"nodeagent/{node_id}", data=data)


def assembled(
    instance_id: int, nodes: list[str], role: Role | str = Role.UNION, ts: float = 2.0
) -> InstanceAssembled:
    members = tuple(
        InstanceMember(node_id=n, node_rank=r, ip="10.0.0.1", endpoints=(ep(0),)) for r, n in enumerate(nodes)
    )
    data = InstanceAssembledData(
        instance_id=instance_id,
        role=Role(role),
        engine_type="builtin",
        model="motor-sim",
        job_name="motor",
        members=members,
        master_dp_ip="10.0.0.1",
    )
    return InstanceAssembled(id=derive_id("asm", instance_id), ts=ts, source="controller/c1", data=data)


def start_cmd(node_id: str, instance_id: int, ts: float = 3.0, attempt: int = 1) -> StartCommand:
    cid = derive_id("start", node_id, instance_id, attempt)
    data = StartCommandData(
        command_id=cid,
        node_id=node_id,
        instance_id=instance_id,
        job_name="motor",
        role=Role.UNION,
        engine_type="builtin",
        model="motor-sim",
        endpoints=(ep(0),),
        master_dp_ip="10.0.0.1",
        attempt=attempt,
    )
    return StartCommand(id=cid, ts=ts, source="controller/c1", caused_by=CausedBy(id="x", seq=1), data=data)


def ep_status(
    node_id: str, status: EndpointStatus | str, ts: float = 4.0, instance_id: int | None = 1
) -> EndpointStatusChanged:
    data = EndpointStatusChangedData(
        node_id=node_id, endpoint_id=0, instance_id=instance_id, status=EndpointStatus(status)
    )
    return EndpointStatusChanged(
        id=derive_id("eps", node_id, status, ts), ts=ts, source=f"nodeagent/{node_id}", data=data
    )
