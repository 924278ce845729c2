"""What events carry: the enums and value parts they share, and each event's `data` payload.

Frozen pydantic models that ignore fields they do not know (a newer producer must not break
an older reader). The envelopes that carry these payloads, with their type names and
subjects, are `core.events`.

Every number has bounds here (`core.bounds`): an event with an out-of-range one does not
decode, so a hostile or broken producer's value is poison, skipped and counted, never folded.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from core.bounds import (
    Attempt,
    Count,
    Duration,
    EndpointId,
    ExitCode,
    InstanceId,
    InstanceRef,
    JsonObject,
    Pid,
    Port,
    Rank,
    ReportedInstanceId,
    SeenTerm,
    Seq,
    Size,
    Term,
    Timestamp,
)


class Frozen(BaseModel):
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


class CausedBy(Frozen):
    """The event a decision answers: its stream sequence (when known) and its id."""

    id: str
    seq: Seq | None = None


# --------------------------------------------------------------------------- shared parts


class EndpointSpec(Frozen):
    """One engine endpoint (a DP rank) on a node, as registered and as started."""

    id: EndpointId
    ip: str
    business_port: Port
    mgmt_port: Port
    bootstrap_port: Port | None = None
    dp_rank: Rank = 0
    headless: bool = False


class ParallelConfig(Frozen):
    tp: Size = 1
    pp: Size = 1
    dp: Size = 1
    dp_local: Size = 1
    nnodes: Size = 1


class Capacity(Frozen):
    max_seq_len: Count = 4096
    total_slots: Count = 256
    total_blocks: Count = 1024
    block_size: Count = 16


class EndpointLoad(Frozen):
    id: EndpointId
    status: EndpointStatus
    avail_slots: Count = 0
    avail_blocks: Count = 0
    running: Count = 0
    waiting: Count = 0


class InstanceMember(Frozen):
    node_id: str
    node_rank: Rank
    ip: str
    endpoints: tuple[EndpointSpec, ...]


# --------------------------------------------------------------------------- data payloads


class NodeRegisteredData(Frozen):
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
    instance_id: ReportedInstanceId | None = None
    running_endpoints: tuple[EndpointId, ...] = ()
    restored: bool = False  # re-registration after a container-snapshot restore
    # The same registration said again so MOTOR's age-out (`nats.max_age_days`) does not take
    # it: a fold that knows the node changes nothing, a fresh fold learns the node from it.
    restated: bool = False


class NodeDeregisteredData(Frozen):
    node_id: str
    reason: str = ""


class HeartbeatData(Frozen):
    node_id: str
    instance_id: InstanceId | None = None
    endpoints: tuple[EndpointLoad, ...] = ()
    snapshot_pending: bool = False


class CommandAppliedData(Frozen):
    command_id: str
    node_id: str
    verb: Literal["start", "stop"]
    instance_id: InstanceId | None = None
    # A graceful stop's outcome: how its engines finished what they carried (drain).
    detail: str = ""


# `command.refused` code of a command older than the newest leader term its node obeyed.
STALE_TERM = "stale_term"


class CommandRefusedData(Frozen):
    command_id: str
    node_id: str
    verb: Literal["start", "stop"]
    instance_id: InstanceId | None = None
    code: str  # job_mismatch | bad_endpoint | port_in_use | spawn_failed | ...
    reason: str
    # On `stale_term`: the newest leader term the node has obeyed. A leader that counted its
    # term from a log that lost the older reigns (a purge) announces itself past it; at most
    # MAX_SEEN_TERM, so reigns stay countable whatever a node says (`core.bounds`).
    seen_term: SeenTerm | None = None


class EndpointStatusChangedData(Frozen):
    node_id: str
    endpoint_id: EndpointId
    instance_id: InstanceId | None = None
    status: EndpointStatus
    previous: EndpointStatus | None = None
    reason: str = ""
    exit_code: ExitCode | None = None
    # The engine process this status is about: a READY with another pid is a new incarnation
    # (routing forgets the old one's circuit). None from older agents and other tools.
    pid: Pid | None = None


class FaultReportedData(Frozen):
    fault_id: str
    node_id: str
    level: FaultLevel
    code: str
    message: str = ""
    instance_id: InstanceId | None = None
    endpoint_id: EndpointId | None = None
    kind: Literal["software", "hardware", "operator"] = "software"


class FaultClearedData(Frozen):
    fault_id: str
    node_id: str
    reason: str = ""


class PrecisionAlarmRaisedData(Frozen):
    alarm_id: str
    d_instance_id: InstanceRef
    p_instance_id: InstanceRef | None = None
    reason: str = ""
    detector: str = "operator"


class PrecisionAlarmClearedData(Frozen):
    d_instance_id: InstanceRef
    p_instance_id: InstanceRef | None = None
    alarm_id: str | None = None
    reason: str = ""


class SnapshotCheckpointData(Frozen):
    node_id: str
    phase: SnapshotPhase
    instance_id: InstanceId | None = None
    job_name: str | None = None
    pod_ip: str | None = None
    metadata: dict[str, str] = Field(default_factory=dict)


class InstanceAssembledData(Frozen):
    instance_id: InstanceId
    role: Role
    engine_type: str
    model: str
    job_name: str
    members: tuple[InstanceMember, ...]
    master_dp_ip: str
    d2d_peer_ips: tuple[str, ...] = ()
    capabilities: tuple[str, ...] = ()


class InstanceRestatedData(Frozen):
    """A live instance said again before MOTOR ages out its `instance.assembled` and state.

    The spec and the state as the controller's fold holds them, with the times of the facts
    restated: a fold that knows the instance changes nothing that routes or restarts, a fold
    of a log that has aged past the original facts learns the instance from this alone.
    """

    instance_id: InstanceId
    spec: InstanceAssembledData
    state: InstanceState
    reason: str = ""
    state_ts: Timestamp
    assembled_ts: Timestamp
    active_ts: Timestamp = 0.0  # its last turn to ACTIVE (0: never)


class InstanceStateChangedData(Frozen):
    instance_id: InstanceId
    state: InstanceState
    previous: InstanceState | None = None
    reason: str = ""


class LeaderChangedData(Frozen):
    leader_id: str
    previous: str | None = None
    term: Term = 0


class InstancesRefreshedData(Frozen):
    """Seed 001's body, already validated by the coordinator, plus Motor's `event` verb.

    Anyone with publish rights may write one, so an entry is only known to be JSON that
    every encoder writes back (`JsonObject`); whoever reads an entry checks what it reads.
    """

    event: Literal["add", "del", "set"] = "set"
    ids: tuple[InstanceRef, ...]
    instances: tuple[JsonObject, ...]


class CircuitChangedData(Frozen):
    """A coordinator opened or closed an endpoint's circuit (it stops or resumes routing to it)."""

    coordinator: str  # the replica that decided (each replica keeps its own circuits)
    endpoint: str  # routing key: "<node_id>/<endpoint_id>" or "ext/<id>[/<endpoint_id>]"
    node_id: str | None = None  # None for engines registered through the refresh API
    endpoint_id: EndpointId | None = None
    instance_id: InstanceRef | None = None
    role: Role | None = None
    state: Literal["open", "closed"]
    reason: str = ""  # the last failure, "probe succeeded", "new incarnation (pid 812)"
    failures: Count = 0  # failures in a row that opened it
    backoff_s: Duration = 0.0  # how long it stays open before a probe (open only)
    pid: Pid | None = None  # the incarnation the circuit belongs to (None: not known)
    ready_seq: Seq | None = None  # MOTOR sequence of that incarnation's READY


class StreamsDisruptedData(Frozen):
    """What requests on one endpoint went through in one window (one event per endpoint and second)."""

    coordinator: str
    endpoint: str
    node_id: str | None = None
    endpoint_id: EndpointId | None = None
    instance_id: InstanceRef | None = None
    role: Role | None = None
    since: Timestamp  # the window
    until: Timestamp
    broken: Count = 0  # streams whose engine died or stalled after the first byte
    continued: Count = 0  # of those, continued on another path
    failed: Count = 0  # of those, cut or ended with an error (no path left, or not continuable)
    retried: Count = 0  # requests that failed here before their first byte and were retried elsewhere
    reasons: dict[str, Count] = Field(default_factory=dict)  # transport | timeout | stall | http_5xx
    continued_on: dict[str, Count] = Field(default_factory=dict)  # endpoint key -> streams


class StartCommandData(Frozen):
    """Motor's StartCmdMsg, addressed to one node."""

    command_id: str
    node_id: str
    instance_id: InstanceId
    job_name: str
    role: Role
    engine_type: str
    model: str
    endpoints: tuple[EndpointSpec, ...]
    master_dp_ip: str
    node_rank: Rank = 0
    nnodes: Size = 1
    d2d_peer_ips: tuple[str, ...] | None = None
    ranktable: JsonObject | None = None
    attempt: Attempt = 1
    # Crashes after READY in a row this start answers (0: not a restart after a crash); the
    # controller's restart backoff and failover count from it.
    restarts: Count = 0
    # The lease term of the leader that sent it (0: sent before commands carried one). A node
    # agent refuses a command older than the newest term it has seen (`stale_term`).
    term: Term = 0


class StopCommandData(Frozen):
    command_id: str
    node_id: str
    instance_id: InstanceId | None = None
    endpoint_ids: tuple[EndpointId, ...] = ()  # empty: every endpoint of the node
    reason: str = ""
    term: Term = 0  # the sending leader's lease term, as on StartCommandData
    # > 0: a graceful stop (a drain): the node waits until its engines have no request running
    # or waiting (at most this long), then stops them.
    drain_timeout: Duration = 0.0
