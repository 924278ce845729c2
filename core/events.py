"""The event catalog: every lifecycle fact and command, each declared once, as one class.

One envelope `{id, type, ts, source, caused_by, schema_version, data}`; `type` is the
discriminator of `AnyEvent`. Each class declares its type name, its payload
(`core.eventdata`) and where it is published (`SUBJECT`, a `core.subjects` placement); the
reducer's handler names the class it handles (`core.handlers.handles`). Event names
are past tense; commands are imperative (`command.start`, `command.stop`) and travel on
`motor.cmd.<node>.<verb>`.

The payload models and enums are importable from here too: this module is the catalog.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, get_args

from pydantic import Field

from core import subjects
from core.bounds import SchemaVersion, Timestamp
from core.eventdata import (
    Capacity,
    CausedBy,
    CircuitChangedData,
    CommandAppliedData,
    CommandRefusedData,
    EndpointLoad,
    EndpointSpec,
    EndpointStatus,
    EndpointStatusChangedData,
    FaultClearedData,
    FaultLevel,
    FaultReportedData,
    Frozen,
    HeartbeatData,
    InstanceAssembledData,
    InstanceMember,
    InstanceRestatedData,
    InstancesRefreshedData,
    InstanceState,
    InstanceStateChangedData,
    LeaderChangedData,
    NodeDeregisteredData,
    NodeRegisteredData,
    ParallelConfig,
    PrecisionAlarmClearedData,
    PrecisionAlarmRaisedData,
    Role,
    SnapshotCheckpointData,
    SnapshotPhase,
    StartCommandData,
    StopCommandData,
    StreamsDisruptedData,
)
from core.fleetopsdata import (
    EngineOpCommandData,
    EngineOpCompletedData,
    EngineOpResult,
    FleetOpArgs,
    FleetOpCompletedData,
    FleetOpRequestedData,
)
from core.opsdata import (
    DrainRequestedData,
    RolloutCompletedData,
    RolloutRequestedData,
    ScaleRequestedData,
    UncordonedData,
)

__all__ = [
    "ALL_EVENTS",
    "EVENT_CLASSES",
    "AnyEvent",
    "Capacity",
    "CausedBy",
    "CircuitChanged",
    "CircuitChangedData",
    "CommandApplied",
    "CommandAppliedData",
    "CommandRefused",
    "CommandRefusedData",
    "DrainRequested",
    "DrainRequestedData",
    "EndpointLoad",
    "EndpointSpec",
    "EndpointStatus",
    "EndpointStatusChanged",
    "EndpointStatusChangedData",
    "EngineOpCommand",
    "EngineOpCommandData",
    "EngineOpCompleted",
    "EngineOpCompletedData",
    "EngineOpResult",
    "EventBase",
    "FaultCleared",
    "FaultClearedData",
    "FaultLevel",
    "FaultReported",
    "FaultReportedData",
    "FleetOpArgs",
    "FleetOpCompleted",
    "FleetOpCompletedData",
    "FleetOpRequested",
    "FleetOpRequestedData",
    "Heartbeat",
    "HeartbeatData",
    "InstanceAssembled",
    "InstanceAssembledData",
    "InstanceMember",
    "InstanceRestated",
    "InstanceRestatedData",
    "InstanceState",
    "InstanceStateChanged",
    "InstanceStateChangedData",
    "InstancesRefreshed",
    "InstancesRefreshedData",
    "LeaderChanged",
    "LeaderChangedData",
    "NodeDeregistered",
    "NodeDeregisteredData",
    "NodeRegistered",
    "NodeRegisteredData",
    "ParallelConfig",
    "PrecisionAlarmCleared",
    "PrecisionAlarmClearedData",
    "PrecisionAlarmRaised",
    "PrecisionAlarmRaisedData",
    "Role",
    "RolloutCompleted",
    "RolloutCompletedData",
    "RolloutRequested",
    "RolloutRequestedData",
    "ScaleRequested",
    "ScaleRequestedData",
    "SnapshotCheckpoint",
    "SnapshotCheckpointData",
    "SnapshotPhase",
    "StartCommand",
    "StartCommandData",
    "StopCommand",
    "StopCommandData",
    "StreamsDisrupted",
    "StreamsDisruptedData",
    "Uncordoned",
    "UncordonedData",
]


class EventBase(Frozen):
    id: str
    # Seconds since the Unix epoch; the only clock a fold ever sees. NaN or infinity would
    # poison every max() and comparison downstream, so the codec refuses them (`core.bounds`).
    ts: Timestamp
    source: str
    caused_by: CausedBy | None = None
    schema_version: SchemaVersion = 1
    type: str  # each class narrows it to its own name (the discriminator of AnyEvent)

    SCHEMA_VERSION: ClassVar[int] = 1
    # Where events of the class are published; every concrete class sets it.
    SUBJECT: ClassVar[subjects.Placement]


# --------------------------------------------------------------------------- the node agent's


class NodeRegistered(EventBase):
    type: Literal["node.registered"] = "node.registered"
    data: NodeRegisteredData
    SUBJECT = subjects.about("node", "node_id")


class NodeDeregistered(EventBase):
    type: Literal["node.deregistered"] = "node.deregistered"
    data: NodeDeregisteredData
    SUBJECT = subjects.about("node", "node_id")


class Heartbeat(EventBase):
    type: Literal["node.heartbeat"] = "node.heartbeat"
    data: HeartbeatData
    SUBJECT = subjects.HEARTBEAT


class CommandApplied(EventBase):
    type: Literal["command.applied"] = "command.applied"
    data: CommandAppliedData
    SUBJECT = subjects.about("node", "node_id")


class CommandRefused(EventBase):
    type: Literal["command.refused"] = "command.refused"
    data: CommandRefusedData
    SUBJECT = subjects.about("node", "node_id")


class EndpointStatusChanged(EventBase):
    type: Literal["endpoint.status_changed"] = "endpoint.status_changed"
    data: EndpointStatusChangedData
    SUBJECT = subjects.about("endpoint", "node_id")


class FaultReported(EventBase):
    type: Literal["fault.reported"] = "fault.reported"
    data: FaultReportedData
    SUBJECT = subjects.about("fault", "node_id")


class FaultCleared(EventBase):
    type: Literal["fault.cleared"] = "fault.cleared"
    data: FaultClearedData
    SUBJECT = subjects.about("fault", "node_id")


class EngineOpCompleted(EventBase):
    type: Literal["node.engine_op_completed"] = "node.engine_op_completed"
    data: EngineOpCompletedData
    SUBJECT = subjects.about("node", "node_id")


class SnapshotCheckpoint(EventBase):
    type: Literal["snapshot.checkpoint"] = "snapshot.checkpoint"
    data: SnapshotCheckpointData
    SUBJECT = subjects.about("snapshot", "node_id")


# --------------------------------------------------------------------------- operators', the detector's


class PrecisionAlarmRaised(EventBase):
    type: Literal["precision.alarm_raised"] = "precision.alarm_raised"
    data: PrecisionAlarmRaisedData
    SUBJECT = subjects.about("precision", "d_instance_id")


class PrecisionAlarmCleared(EventBase):
    type: Literal["precision.alarm_cleared"] = "precision.alarm_cleared"
    data: PrecisionAlarmClearedData
    SUBJECT = subjects.about("precision", "d_instance_id")


# --------------------------------------------------------------------------- the controller's


class InstanceAssembled(EventBase):
    type: Literal["instance.assembled"] = "instance.assembled"
    data: InstanceAssembledData
    SUBJECT = subjects.about("instance", "instance_id")


class InstanceRestated(EventBase):
    type: Literal["instance.restated"] = "instance.restated"
    data: InstanceRestatedData
    SUBJECT = subjects.about("instance", "instance_id")


class InstanceStateChanged(EventBase):
    type: Literal["instance.state_changed"] = "instance.state_changed"
    data: InstanceStateChangedData
    SUBJECT = subjects.about("instance", "instance_id")


class LeaderChanged(EventBase):
    type: Literal["controller.leader_changed"] = "controller.leader_changed"
    data: LeaderChangedData
    SUBJECT = subjects.Fixed(subjects.LEADER)


class StartCommand(EventBase):
    type: Literal["command.start"] = "command.start"
    data: StartCommandData
    SUBJECT = subjects.to_node("start")


class StopCommand(EventBase):
    type: Literal["command.stop"] = "command.stop"
    data: StopCommandData
    SUBJECT = subjects.to_node("stop")


class EngineOpCommand(EventBase):
    type: Literal["command.engine_op"] = "command.engine_op"
    data: EngineOpCommandData
    SUBJECT = subjects.to_node("engineop")


class FleetOpCompleted(EventBase):
    type: Literal["controller.fleet_op_completed"] = "controller.fleet_op_completed"
    data: FleetOpCompletedData
    SUBJECT = subjects.about("fleetop", "op_id")


# --------------------------------------------------------------------------- the operator's


class DrainRequested(EventBase):
    type: Literal["operator.drain_requested"] = "operator.drain_requested"
    data: DrainRequestedData
    SUBJECT = subjects.about("drain", "entity")


class Uncordoned(EventBase):
    type: Literal["operator.uncordoned"] = "operator.uncordoned"
    data: UncordonedData
    SUBJECT = subjects.about("cordon", "node_id")


class ScaleRequested(EventBase):
    type: Literal["operator.scale_requested"] = "operator.scale_requested"
    data: ScaleRequestedData
    SUBJECT = subjects.about("scale", "role")


class RolloutRequested(EventBase):
    type: Literal["operator.rollout_requested"] = "operator.rollout_requested"
    data: RolloutRequestedData
    SUBJECT = subjects.about("rollout", "rollout_id")


class RolloutCompleted(EventBase):
    type: Literal["controller.rollout_completed"] = "controller.rollout_completed"
    data: RolloutCompletedData
    SUBJECT = subjects.about("rollout", "rollout_id")


class FleetOpRequested(EventBase):
    type: Literal["operator.fleet_op_requested"] = "operator.fleet_op_requested"
    data: FleetOpRequestedData
    SUBJECT = subjects.about("fleetop", "op_id")


# --------------------------------------------------------------------------- the coordinator's


class InstancesRefreshed(EventBase):
    type: Literal["instances.refreshed"] = "instances.refreshed"
    data: InstancesRefreshedData
    SUBJECT = subjects.Fixed(subjects.REFRESH)


class CircuitChanged(EventBase):
    type: Literal["coordinator.circuit_changed"] = "coordinator.circuit_changed"
    data: CircuitChangedData
    SUBJECT = subjects.ByEndpoint("circuit")


class StreamsDisrupted(EventBase):
    type: Literal["coordinator.streams_disrupted"] = "coordinator.streams_disrupted"
    data: StreamsDisruptedData
    SUBJECT = subjects.ByEndpoint("streams")


# The one list of event classes: the union the codec decodes through; `ALL_EVENTS` and
# `EVENT_CLASSES` are read from it. Written as a union (not built from a tuple) so the type
# checker sees each member: `isinstance` narrows an `AnyEvent` to its class.
AnyEvent = Annotated[
    NodeRegistered
    | NodeDeregistered
    | Heartbeat
    | CommandApplied
    | CommandRefused
    | EndpointStatusChanged
    | FaultReported
    | FaultCleared
    | PrecisionAlarmRaised
    | PrecisionAlarmCleared
    | SnapshotCheckpoint
    | InstanceAssembled
    | InstanceRestated
    | InstanceStateChanged
    | LeaderChanged
    | InstancesRefreshed
    | CircuitChanged
    | StreamsDisrupted
    | StartCommand
    | StopCommand
    | DrainRequested
    | Uncordoned
    | ScaleRequested
    | RolloutRequested
    | RolloutCompleted
    | FleetOpRequested
    | EngineOpCommand
    | EngineOpCompleted
    | FleetOpCompleted,
    Field(discriminator="type"),
]

ALL_EVENTS: tuple[type[EventBase], ...] = get_args(get_args(AnyEvent)[0])
EVENT_CLASSES: dict[str, type[EventBase]] = {cls.model_fields["type"].default: cls for cls in ALL_EVENTS}
