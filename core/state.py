"""ClusterState: what the log says about the cluster at one stream position.

Immutable: records are frozen dataclasses, collections are `immutables.Map` (a HAMT, so a
change costs O(log n) and old states stay valid). `apply` in `core.reducer` builds new states.
`state_to_dict`/`state_from_dict` give the JSON form used by checkpoints and exports.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import immutables

from core.events import (
    EndpointLoad,
    EndpointStatus,
    FaultReportedData,
    InstanceAssembledData,
    InstanceState,
    LeaderChangedData,
    NodeRegisteredData,
    PrecisionAlarmRaisedData,
    SnapshotPhase,
    StartCommandData,
    StopCommandData,
)
from core.opsstate import NO_OPERATIONS, Operations, ops_from_dict, ops_to_dict

CommandStatus = Literal["pending", "applied", "refused"]

# An instance in these states is out of routing and waits for the controller.
PENDING_SNAPSHOT_PHASES = frozenset({SnapshotPhase.SUSPENDED, SnapshotPhase.CHECKPOINT_DONE})


# A command record holds one verb's data: `StartRecord` or `StopRecord`.
D = TypeVar("D", StartCommandData, StopCommandData)


@dataclass(frozen=True, slots=True)
class CommandRecord(Generic[D]):
    """A node's latest command of one verb, where it sits in the log, and what became of it."""

    data: D
    ts: float
    seq: int
    status: CommandStatus = "pending"
    reason: str = ""
    status_ts: float | None = None
    # Refused `stale_term`: the newer leader term the node had obeyed (0 otherwise). The
    # command is not a failed attempt: it is sent again once a reign past this term leads.
    outranked_by: int = 0


StartRecord = CommandRecord[StartCommandData]
StopRecord = CommandRecord[StopCommandData]


@dataclass(frozen=True, slots=True)
class NodeRecord:
    reg: NodeRegisteredData
    order: int  # registration order, first registration wins (node_rank follows it)
    registered_ts: float
    registered_seq: int
    instance_id: int | None = None
    endpoint_status: dict[int, EndpointStatus] = field(default_factory=dict)
    endpoint_reason: dict[int, str] = field(default_factory=dict)
    last_hb_ts: float | None = None
    load: tuple[EndpointLoad, ...] = ()
    start_cmd: StartRecord | None = None
    stop_cmd: StopRecord | None = None
    # Where each endpoint status came from (stream seq and event id), so a decision can tell
    # a READY reported after its start command from a stale one and name what it answers.
    endpoint_seq: dict[int, int] = field(default_factory=dict)
    endpoint_event_id: dict[int, str] = field(default_factory=dict)
    registered_id: str = ""
    last_hb_id: str | None = None

    @property
    def node_id(self) -> str:
        return self.reg.node_id

    def all_ready(self) -> bool:
        eps = [e.id for e in self.reg.endpoints]
        return bool(eps) and all(self.endpoint_status.get(e) == EndpointStatus.READY for e in eps)


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    spec: InstanceAssembledData
    state: InstanceState
    state_ts: float
    assembled_ts: float
    assembled_seq: int
    reason: str = ""
    assembled_id: str = ""
    active_seq: int = 0  # stream seq of the last transition to ACTIVE (0: never active)
    active_ts: float = 0.0  # and its time: how long it had served when it crashed
    # When the controller last restated the instance (`instance.restated`; 0: never): with
    # `assembled_ts` it tells how soon MOTOR's age-out would take the facts that define it.
    restated_ts: float = 0.0

    @property
    def instance_id(self) -> int:
        return self.spec.instance_id

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(m.node_id for m in self.spec.members)


@dataclass(frozen=True, slots=True)
class FaultRecord:
    data: FaultReportedData
    ts: float
    seq: int
    event_id: str


@dataclass(frozen=True, slots=True)
class AlarmRecord:
    data: PrecisionAlarmRaisedData
    ts: float
    seq: int
    event_id: str


@dataclass(frozen=True, slots=True)
class SnapshotRecord:
    phase: SnapshotPhase
    ts: float
    instance_id: int | None = None
    job_name: str | None = None
    seq: int = 0
    event_id: str = ""

    @property
    def pending(self) -> bool:
        return self.phase in PENDING_SNAPSHOT_PHASES


@dataclass(frozen=True, slots=True)
class ClusterState:
    nodes: immutables.Map[str, NodeRecord] = field(default_factory=immutables.Map)
    instances: immutables.Map[int, InstanceRecord] = field(default_factory=immutables.Map)
    faults: immutables.Map[str, FaultRecord] = field(default_factory=immutables.Map)
    alarms: immutables.Map[int, AlarmRecord] = field(default_factory=immutables.Map)  # by d_instance_id
    snapshots: immutables.Map[str, SnapshotRecord] = field(default_factory=immutables.Map)
    external: immutables.Map[int, dict[str, Any]] = field(default_factory=immutables.Map)
    leader: LeaderChangedData | None = None
    leader_ts: float | None = None
    next_instance_id: int = 1
    # Instance ids this fold saw terminated. After a lost log the fold starts from a partial
    # history where ids come back out of order: "below next_instance_id" no longer means
    # "terminated", this does (controller.assembly re-adopts the rest).
    retired: frozenset[int] = frozenset()
    # Drains under way, cordoned nodes, run-time scale, rolling restarts (`core.opsstate`).
    ops: Operations = NO_OPERATIONS
    next_order: int = 0
    last_seq: int = 0
    last_ts: float = 0.0
    events_applied: int = 0

    def node_faults(self, node_id: str) -> list[FaultRecord]:
        return [f for f in self.faults.values() if f.data.node_id == node_id]

    def instance_faults(self, instance_id: int) -> list[FaultRecord]:
        inst = self.instances.get(instance_id)
        members = set(inst.node_ids) if inst else set()
        return [
            f for f in self.faults.values() if f.data.instance_id == instance_id or f.data.node_id in members
        ]

    def snapshot_pending(self, instance_id: int) -> bool:
        inst = self.instances.get(instance_id)
        if inst is None:
            return False
        return any((rec := self.snapshots.get(n)) is not None and rec.pending for n in inst.node_ids)


# --------------------------------------------------------------------------- JSON form


def _dump(model: Any) -> Any:
    return model.model_dump(mode="json") if model is not None else None


def _cmd_to(rec: CommandRecord[Any] | None, verb: str) -> dict[str, Any] | None:
    if rec is None:
        return None
    return {
        "verb": verb,
        "data": _dump(rec.data),
        "ts": rec.ts,
        "seq": rec.seq,
        "status": rec.status,
        "reason": rec.reason,
        "status_ts": rec.status_ts,
        "outranked_by": rec.outranked_by,
    }


def _cmd_from(raw: dict[str, Any] | None, cls: type[D]) -> CommandRecord[D] | None:
    if raw is None:
        return None
    return CommandRecord(
        data=cls.model_validate(raw["data"]),
        ts=raw["ts"],
        seq=raw["seq"],
        status=raw["status"],
        reason=raw["reason"],
        status_ts=raw["status_ts"],
        outranked_by=raw.get("outranked_by", 0),
    )


def state_to_dict(state: ClusterState) -> dict[str, Any]:
    """The JSON-ready form of a state (checkpoints, exports, comparisons in tests)."""
    return {
        "nodes": {
            k: {
                "reg": _dump(n.reg),
                "order": n.order,
                "registered_ts": n.registered_ts,
                "registered_seq": n.registered_seq,
                "instance_id": n.instance_id,
                "endpoint_status": {str(e): s.value for e, s in sorted(n.endpoint_status.items())},
                "endpoint_reason": {str(e): r for e, r in sorted(n.endpoint_reason.items())},
                "last_hb_ts": n.last_hb_ts,
                "load": [_dump(x) for x in n.load],
                "start_cmd": _cmd_to(n.start_cmd, "start"),
                "stop_cmd": _cmd_to(n.stop_cmd, "stop"),
                "endpoint_seq": {str(e): q for e, q in sorted(n.endpoint_seq.items())},
                "endpoint_event_id": {str(e): i for e, i in sorted(n.endpoint_event_id.items())},
                "registered_id": n.registered_id,
                "last_hb_id": n.last_hb_id,
            }
            for k, n in sorted(state.nodes.items())
        },
        "instances": {
            str(k): {
                "spec": _dump(i.spec),
                "state": i.state.value,
                "state_ts": i.state_ts,
                "assembled_ts": i.assembled_ts,
                "assembled_seq": i.assembled_seq,
                "reason": i.reason,
                "assembled_id": i.assembled_id,
                "active_seq": i.active_seq,
                "active_ts": i.active_ts,
                "restated_ts": i.restated_ts,
            }
            for k, i in sorted(state.instances.items())
        },
        "faults": {
            k: {"data": _dump(f.data), "ts": f.ts, "seq": f.seq, "event_id": f.event_id}
            for k, f in sorted(state.faults.items())
        },
        "alarms": {
            str(k): {"data": _dump(a.data), "ts": a.ts, "seq": a.seq, "event_id": a.event_id}
            for k, a in sorted(state.alarms.items())
        },
        "snapshots": {
            k: {
                "phase": s.phase.value,
                "ts": s.ts,
                "instance_id": s.instance_id,
                "job_name": s.job_name,
                "seq": s.seq,
                "event_id": s.event_id,
            }
            for k, s in sorted(state.snapshots.items())
        },
        "external": {str(k): v for k, v in sorted(state.external.items())},
        "leader": _dump(state.leader),
        "leader_ts": state.leader_ts,
        "next_instance_id": state.next_instance_id,
        "retired": sorted(state.retired),
        "ops": ops_to_dict(state.ops),
        "next_order": state.next_order,
        "last_seq": state.last_seq,
        "last_ts": state.last_ts,
        "events_applied": state.events_applied,
    }


def state_from_dict(raw: dict[str, Any]) -> ClusterState:
    """Inverse of `state_to_dict`."""
    nodes = {
        k: NodeRecord(
            reg=NodeRegisteredData.model_validate(n["reg"]),
            order=n["order"],
            registered_ts=n["registered_ts"],
            registered_seq=n["registered_seq"],
            instance_id=n["instance_id"],
            endpoint_status={int(e): EndpointStatus(s) for e, s in n["endpoint_status"].items()},
            endpoint_reason={int(e): r for e, r in n["endpoint_reason"].items()},
            last_hb_ts=n["last_hb_ts"],
            load=tuple(EndpointLoad.model_validate(x) for x in n["load"]),
            start_cmd=_cmd_from(n["start_cmd"], StartCommandData),
            stop_cmd=_cmd_from(n["stop_cmd"], StopCommandData),
            endpoint_seq={int(e): q for e, q in n.get("endpoint_seq", {}).items()},
            endpoint_event_id={int(e): i for e, i in n.get("endpoint_event_id", {}).items()},
            registered_id=n.get("registered_id", ""),
            last_hb_id=n.get("last_hb_id"),
        )
        for k, n in raw["nodes"].items()
    }
    instances = {
        int(k): InstanceRecord(
            spec=InstanceAssembledData.model_validate(i["spec"]),
            state=InstanceState(i["state"]),
            state_ts=i["state_ts"],
            assembled_ts=i["assembled_ts"],
            assembled_seq=i["assembled_seq"],
            reason=i["reason"],
            assembled_id=i.get("assembled_id", ""),
            active_seq=i.get("active_seq", 0),
            active_ts=i.get("active_ts", 0.0),
            restated_ts=i.get("restated_ts", 0.0),
        )
        for k, i in raw["instances"].items()
    }
    faults = {
        k: FaultRecord(FaultReportedData.model_validate(f["data"]), f["ts"], f["seq"], f["event_id"])
        for k, f in raw["faults"].items()
    }
    alarms = {
        int(k): AlarmRecord(
            PrecisionAlarmRaisedData.model_validate(a["data"]), a["ts"], a["seq"], a["event_id"]
        )
        for k, a in raw["alarms"].items()
    }
    snapshots = {
        k: SnapshotRecord(
            SnapshotPhase(s["phase"]),
            s["ts"],
            s["instance_id"],
            s["job_name"],
            s.get("seq", 0),
            s.get("event_id", ""),
        )
        for k, s in raw["snapshots"].items()
    }
    leader = raw.get("leader")
    return ClusterState(
        nodes=immutables.Map(nodes),
        instances=immutables.Map(instances),
        faults=immutables.Map(faults),
        alarms=immutables.Map(alarms),
        snapshots=immutables.Map(snapshots),
        external=immutables.Map({int(k): v for k, v in raw["external"].items()}),
        leader=LeaderChangedData.model_validate(leader) if leader else None,
        leader_ts=raw["leader_ts"],
        next_instance_id=raw["next_instance_id"],
        retired=_retired(raw, instances),
        ops=ops_from_dict(raw.get("ops")),
        next_order=raw["next_order"],
        last_seq=raw["last_seq"],
        last_ts=raw["last_ts"],
        events_applied=raw["events_applied"],
    )


def _retired(raw: dict[str, Any], instances: dict[int, InstanceRecord]) -> frozenset[int]:
    if "retired" in raw:
        return frozenset(int(i) for i in raw["retired"])
    # A checkpoint from before the field: folded from a whole log, every id below the next
    # one that is not live was terminated.
    return frozenset(range(1, int(raw["next_instance_id"]))) - frozenset(instances)
