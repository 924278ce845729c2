"""The event catalog: every lifecycle fact and command as a frozen pydantic model.

One envelope `{id, type, ts, source, caused_by, schema_version, data}`; `type` is the
discriminator of `AnyEvent`. Event names are past tense; commands are imperative
(`command.start`, `command.stop`) and travel on `motor.cmd.<node>.<verb>`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat


class _Frozen(BaseModel):
    # Tolerant reader: a field added by a newer producer must not break an older consumer.
    model_config = ConfigDict(frozen=True, extra="ignore")


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    UNION = "union"


class EndpointStatus(StrEnum):
    STARTING = "STARTING"
    READY = "READY"
    ABNORMAL = "ABNORMAL"
    DEAD = "DEAD"
    STOPPED = "STOPPED"


class InstanceState(StrEnum):
    INITIAL = "INITIAL"
    ACTIVE = "ACTIVE"
    INACTIVE = "INACTIVE"  # heartbeats lapsed; may come back on its own
    DEGRADED = "DEGRADED"  # serving, but part of it is unhealthy
    ISOLATED = "ISOLATED"  # taken out of routing by a fault or a precision alarm
    RECOVERING = "RECOVERING"  # restart/replace under way
    TERMINATED = "TERMINATED"  # gone; its nodes are free for re-assembly


class FaultLevel(StrEnum):
    L1 = "L1"
    L2 = "L2"
    L3 = "L3"
    L4 = "L4"
    L5 = "L5"
    L6 = "L6"


class SnapshotPhase(StrEnum):
    METADATA_PREPARED = "metadata_prepared"
    SUSPENDED = "suspended"
    CHECKPOINT_DONE = "checkpoint_done"
    RESTORED = "restored"


class CausedBy(_Frozen):
    """The event a decision answers: its stream sequence (when known) and its id."""

    id: str
    seq: int | None = None


# --------------------------------------------------------------------------- shared parts


class EndpointSpec(_Frozen):
    """One engine endpoint (a DP rank) on a node, as registered and as started."""

    id: int
    ip: str
    business_port: int
    mgmt_port: int
    bootstrap_port: int | None = None
    dp_rank: int = 0
    headless: bool = False


class ParallelConfig(_Frozen):
    tp: int = 1
    pp: int = 1
    dp: int = 1
    dp_local: int = 1
    nnodes: int = 1


class Capacity(_Frozen):
    max_seq_len: int = 4096
    total_slots: int = 256
    total_blocks: int = 1024
    block_size: int = 16


class EndpointLoad(_Frozen):
    id: int
    status: EndpointStatus
    avail_slots: int = 0
    avail_blocks: int = 0
    running: int = 0
    waiting: int = 0


class InstanceMember(_Frozen):
    node_id: str
    node_rank: int
    ip: str
    endpoints: tuple[EndpointSpec, ...]


# --------------------------------------------------------------------------- data payloads


class NodeRegisteredData(_Frozen):
    node_id: str
    job_name: str
    pod_ip: str
    role: Role
    engine_type: str
    model: str
    devices: tuple[str, ...] = ()
    endpoints: tuple[EndpointSpec, ...] = ()
    parallel: ParallelConfig = ParallelConfig()
    capacity: Capacity = Capacity()
    capabilities: tuple[str, ...] = ()
    agent_url: str | None = None
    # Ground truth re-asserted after a restart or a lost log tail: what the node runs now.
    instance_id: int | None = None
    running_endpoints: tuple[int, ...] = ()
    restored: bool = False  # re-registration after a container-snapshot restore


class NodeDeregisteredData(_Frozen):
    node_id: str
    reason: str = ""


class HeartbeatData(_Frozen):
    node_id: str
    instance_id: int | None = None
    endpoints: tuple[EndpointLoad, ...] = ()
    snapshot_pending: bool = False


class CommandAppliedData(_Frozen):
    command_id: str
    node_id: str
    verb: Literal["start", "stop"]
    instance_id: int | None = None


class CommandRefusedData(_Frozen):
    command_id: str
    node_id: str
    verb: Literal["start", "stop"]
    instance_id: int | None = None
    code: str  # job_mismatch | bad_endpoint | port_in_use | spawn_failed | ...
    reason: str


class EndpointStatusChangedData(_Frozen):
    node_id: str
    endpoint_id: int
    instance_id: int | None = None
    status: EndpointStatus
    previous: EndpointStatus | None = None
    reason: str = ""
    exit_code: int | None = None
    # The engine process this status is about: a READY with another pid is a new incarnation
    # (routing forgets the old one's circuit). None from older agents and other tools.
    pid: int | None = None


class FaultReportedData(_Frozen):
    fault_id: str
    node_id: str
    level: FaultLevel
    code: str
    message: str = ""
    instance_id: int | None = None
    endpoint_id: int | None = None
    kind: Literal["software", "hardware", "operator"] = "software"


class FaultClearedData(_Frozen):
    fault_id: str
    node_id: str
    reason: str = ""


class PrecisionAlarmRaisedData(_Frozen):
    alarm_id: str
    d_instance_id: int
    p_instance_id: int | None = None
    reason: str = ""
    detector: str = "operator"


class PrecisionAlarmClearedData(_Frozen):
    d_instance_id: int
    p_instance_id: int | None = None
    alarm_id: str | None = None
    reason: str = ""


class SnapshotCheckpointData(_Frozen):
    node_id: str
    phase: SnapshotPhase
    instance_id: int | None = None
    job_name: str | None = None
    pod_ip: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)


class InstanceAssembledData(_Frozen):
    instance_id: int
    role: Role
    engine_type: str
    model: str
    job_name: str
    members: tuple[InstanceMember, ...]
    master_dp_ip: str
    d2d_peer_ips: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()


class InstanceStateChangedData(_Frozen):
    instance_id: int
    state: InstanceState
    previous: InstanceState | None = None
    reason: str = ""


class LeaderChangedData(_Frozen):
    leader_id: str
    previous: str | None = None
    term: int = 0


class InstancesRefreshedData(_Frozen):
    """Seed 001's body, already validated by the coordinator, plus Motor's `event` verb."""

    event: Literal["add", "del", "set"] = "set"
    ids: tuple[int, ...]
    instances: tuple[dict[str, Any], ...]


class CircuitChangedData(_Frozen):
    """A coordinator opened or closed an endpoint's circuit (it stops or resumes routing to it)."""

    coordinator: str  # the replica that decided (each replica keeps its own circuits)
    endpoint: str  # routing key: "<node_id>/<endpoint_id>" or "ext/<id>[/<endpoint_id>]"
    node_id: str | None = None  # None for engines registered through the refresh API
    endpoint_id: int | None = None
    instance_id: int | None = None
    role: Role | None = None
    state: Literal["open", "closed"]
    reason: str = ""  # the last failure, "probe succeeded", "new incarnation (pid 812)"
    failures: int = 0  # failures in a row that opened it
    backoff_s: float = 0.0  # how long it stays open before a probe (open only)
    pid: int | None = None  # the incarnation the circuit belongs to (None: not known)
    ready_seq: int | None = None  # MOTOR sequence of that incarnation's READY


class StreamsDisruptedData(_Frozen):
    """What requests on one endpoint went through in one window (one event per endpoint and second)."""

    coordinator: str
    endpoint: str
    node_id: str | None = None
    endpoint_id: int | None = None
    instance_id: int | None = None
    role: Role | None = None
    since: float  # the window, seconds since the Unix epoch
    until: float
    broken: int = 0  # streams whose engine died or stalled after the first byte
    continued: int = 0  # of those, continued on another path
    failed: int = 0  # of those, cut or ended with an error (no path left, or not continuable)
    retried: int = 0  # requests that failed here before their first byte and were retried elsewhere
    reasons: dict[str, int] = Field(default_factory=dict)  # transport | timeout | stall | http_5xx
    continued_on: dict[str, int] = Field(default_factory=dict)  # endpoint key -> streams


class StartCommandData(_Frozen):
    """Motor's StartCmdMsg, addressed to one node."""

    command_id: str
    node_id: str
    instance_id: int
    job_name: str
    role: Role
    engine_type: str
    model: str
    endpoints: tuple[EndpointSpec, ...]
    master_dp_ip: str
    node_rank: int = 0
    nnodes: int = 1
    d2d_peer_ips: tuple[str, ...] | None = None
    ranktable: dict[str, Any] | None = None
    attempt: int = 1
    # Crashes after READY in a row this start answers (0: not a restart after a crash); the
    # controller's restart backoff and failover count from it.
    restarts: int = 0
    # The lease term of the leader that sent it (0: sent before commands carried one). A node
    # agent refuses a command older than the newest term it has seen (`stale_term`).
    term: int = 0


class StopCommandData(_Frozen):
    command_id: str
    node_id: str
    instance_id: int | None = None
    endpoint_ids: tuple[int, ...] = ()  # empty: every endpoint of the node
    reason: str = ""
    term: int = 0  # the sending leader's lease term, as on StartCommandData


# --------------------------------------------------------------------------- envelopes


class EventBase(_Frozen):
    id: str
    # Seconds since the Unix epoch; the only clock a fold ever sees. NaN or infinity would
    # poison every max() and comparison downstream, so the codec refuses them.
    ts: FiniteFloat
    source: str
    caused_by: CausedBy | None = None
    schema_version: int = 1

    SCHEMA_VERSION: ClassVar[int] = 1


class NodeRegistered(EventBase):
    type: Literal["node.registered"] = "node.registered"
    data: NodeRegisteredData


class NodeDeregistered(EventBase):
    type: Literal["node.deregistered"] = "node.deregistered"
    data: NodeDeregisteredData


class Heartbeat(EventBase):
    type: Literal["node.heartbeat"] = "node.heartbeat"
    data: HeartbeatData


class CommandApplied(EventBase):
    type: Literal["command.applied"] = "command.applied"
    data: CommandAppliedData


class CommandRefused(EventBase):
    type: Literal["command.refused"] = "command.refused"
    data: CommandRefusedData


class EndpointStatusChanged(EventBase):
    type: Literal["endpoint.status_changed"] = "endpoint.status_changed"
    data: EndpointStatusChangedData


class FaultReported(EventBase):
    type: Literal["fault.reported"] = "fault.reported"
    data: FaultReportedData


class FaultCleared(EventBase):
    type: Literal["fault.cleared"] = "fault.cleared"
    data: FaultClearedData


class PrecisionAlarmRaised(EventBase):
    type: Literal["precision.alarm_raised"] = "precision.alarm_raised"
    data: PrecisionAlarmRaisedData


class PrecisionAlarmCleared(EventBase):
    type: Literal["precision.alarm_cleared"] = "precision.alarm_cleared"
    data: PrecisionAlarmClearedData


class SnapshotCheckpoint(EventBase):
    type: Literal["snapshot.checkpoint"] = "snapshot.checkpoint"
    data: SnapshotCheckpointData


class InstanceAssembled(EventBase):
    type: Literal["instance.assembled"] = "instance.assembled"
    data: InstanceAssembledData


class InstanceStateChanged(EventBase):
    type: Literal["instance.state_changed"] = "instance.state_changed"
    data: InstanceStateChangedData


class LeaderChanged(EventBase):
    type: Literal["controller.leader_changed"] = "controller.leader_changed"
    data: LeaderChangedData


class InstancesRefreshed(EventBase):
    type: Literal["instances.refreshed"] = "instances.refreshed"
    data: InstancesRefreshedData


class CircuitChanged(EventBase):
    type: Literal["coordinator.circuit_changed"] = "coordinator.circuit_changed"
    data: CircuitChangedData


class StreamsDisrupted(EventBase):
    type: Literal["coordinator.streams_disrupted"] = "coordinator.streams_disrupted"
    data: StreamsDisruptedData


class StartCommand(EventBase):
    type: Literal["command.start"] = "command.start"
    data: StartCommandData


class StopCommand(EventBase):
    type: Literal["command.stop"] = "command.stop"
    data: StopCommandData


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
    | InstanceStateChanged
    | LeaderChanged
    | InstancesRefreshed
    | CircuitChanged
    | StreamsDisrupted
    | StartCommand
    | StopCommand,
    Field(discriminator="type"),
]

EVENT_CLASSES: dict[str, type[EventBase]] = {
    cls.model_fields["type"].default: cls
    for cls in (
        NodeRegistered,
        NodeDeregistered,
        Heartbeat,
        CommandApplied,
        CommandRefused,
        EndpointStatusChanged,
        FaultReported,
        FaultCleared,
        PrecisionAlarmRaised,
        PrecisionAlarmCleared,
        SnapshotCheckpoint,
        InstanceAssembled,
        InstanceStateChanged,
        LeaderChanged,
        InstancesRefreshed,
        CircuitChanged,
        StreamsDisrupted,
        StartCommand,
        StopCommand,
    )
}
