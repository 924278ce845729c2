"""Event builders for the coordinator's table tests: a cluster in a few lines."""

from __future__ import annotations

from typing import Any

from core.events import (
    EndpointLoad,
    EndpointSpec,
    EndpointStatus,
    EndpointStatusChanged,
    EndpointStatusChangedData,
    EventBase,
    Heartbeat,
    HeartbeatData,
    InstanceAssembled,
    InstanceAssembledData,
    InstanceMember,
    InstancesRefreshed,
    InstancesRefreshedData,
    InstanceState,
    InstanceStateChanged,
    InstanceStateChangedData,
    NodeRegistered,
    NodeRegisteredData,
    PrecisionAlarmCleared,
    PrecisionAlarmClearedData,
    PrecisionAlarmRaised,
    PrecisionAlarmRaisedData,
    Role,
)
from core.ids import new_id


def instance_events(
    instance_id: int,
    role: Role,
    *,
    engine_type: str = "builtin",
    model: str = "motor-sim",
    capabilities: tuple[str, ...] = (),
    port: int | None = None,
    bootstrap_port: int | None = None,
    state: InstanceState | None = InstanceState.ACTIVE,
    status: EndpointStatus | None = EndpointStatus.READY,
    endpoints: int = 1,
) -> list[EventBase]:
    """A node registered, assembled into an instance, its endpoints' status, the instance state."""
    node_id = f"n{instance_id}"
    base = port if port is not None else 9000 + 10 * instance_id
    eps = tuple(
        EndpointSpec(
            id=i, ip="127.0.0.1", business_port=base + i, mgmt_port=base + i, bootstrap_port=bootstrap_port
        )
        for i in range(endpoints)
    )
    out: list[EventBase] = [
        NodeRegistered(
            id=new_id(),
            ts=1.0,
            source=f"nodeagent/{node_id}",
            data=NodeRegisteredData(
                node_id=node_id,
                job_name="motor",
                pod_ip="127.0.0.1",
                role=role,
                engine_type=engine_type,
                model=model,
                endpoints=eps,
                capabilities=capabilities,
            ),
        ),
        InstanceAssembled(
            id=new_id(),
            ts=2.0,
            source="controller/c1",
            data=InstanceAssembledData(
                instance_id=instance_id,
                role=role,
                engine_type=engine_type,
                model=model,
                job_name="motor",
                members=(InstanceMember(node_id=node_id, node_rank=0, ip="127.0.0.1", endpoints=eps),),
                master_dp_ip="127.0.0.1",
                capabilities=capabilities,
            ),
        ),
    ]
    if status is not None:
        out += [endpoint_status(node_id, i, status, instance_id) for i in range(endpoints)]
    if state is not None:
        out.append(instance_state(instance_id, state))
    return out


def endpoint_status(
    node_id: str,
    endpoint_id: int,
    status: EndpointStatus,
    instance_id: int,
    *,
    pid: int | None = None,
    previous: EndpointStatus | None = None,
) -> EventBase:
    return EndpointStatusChanged(
        id=new_id(),
        ts=3.0,
        source=f"nodeagent/{node_id}",
        data=EndpointStatusChangedData(
            node_id=node_id,
            endpoint_id=endpoint_id,
            instance_id=instance_id,
            status=status,
            previous=previous,
            pid=pid,
        ),
    )


def instance_state(instance_id: int, state: InstanceState) -> EventBase:
    return InstanceStateChanged(
        id=new_id(),
        ts=4.0,
        source="controller/c1",
        data=InstanceStateChangedData(instance_id=instance_id, state=state),
    )


def heartbeat(node_id: str, *loads: tuple[int, int, int]) -> Heartbeat:
    """Loads as (endpoint_id, running, waiting)."""
    return Heartbeat(
        id=new_id(),
        ts=5.0,
        source=f"nodeagent/{node_id}",
        data=HeartbeatData(
            node_id=node_id,
            endpoints=tuple(
                EndpointLoad(
                    id=e, status=EndpointStatus.READY, running=r, waiting=w, avail_slots=7, avail_blocks=9
                )
                for e, r, w in loads
            ),
        ),
    )


def alarm(d_instance_id: int, p_instance_id: int | None = None) -> EventBase:
    return PrecisionAlarmRaised(
        id=new_id(),
        ts=6.0,
        source="operator",
        data=PrecisionAlarmRaisedData(
            alarm_id=new_id(), d_instance_id=d_instance_id, p_instance_id=p_instance_id
        ),
    )


def alarm_cleared(d_instance_id: int) -> EventBase:
    return PrecisionAlarmCleared(
        id=new_id(), ts=7.0, source="operator", data=PrecisionAlarmClearedData(d_instance_id=d_instance_id)
    )


def seed_instance(
    iid: int,
    role_code: int = 85,
    label: int = 2,
    *,
    port: str = "1025",
    model: str = "your_model_name",
    peers: list[int] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """One instance of a seed 001 refresh body."""
    dynamic: dict[str, Any] = {"avail_slots_num": 150, "avail_block_num": 1000}
    if peers is not None:
        dynamic["peers"] = peers
    inst: dict[str, Any] = {
        "id": iid,
        "ip": "127.0.0.1",
        "port": port,
        "metric_port": "1026",
        "model_name": model,
        "static_info": {
            "group_id": 0,
            "max_seq_len": 2048,
            "max_output_len": 512,
            "total_slots_num": 200,
            "total_block_num": 1024,
            "block_size": 128,
            "label": label,
            "role": role_code,
        },
        "dynamic_info": dynamic,
    }
    inst.update(extra)
    return inst


def refreshed(instances: list[dict[str, Any]], event: str = "set", ids: list[int] | None = None) -> EventBase:
    return InstancesRefreshed(
        id=new_id(),
        ts=8.0,
        source="coordinator",
        data=InstancesRefreshedData(
            event=event,  # type: ignore[arg-type]
            ids=tuple(ids if ids is not None else [i["id"] for i in instances]),
            instances=tuple(instances),
        ),
    )
