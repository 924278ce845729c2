"""The vocabulary of the controller's rules: what a rule looks at (`Ctx`: the state, the config,
the given time), what it answers (`Cause`) and what it returns (`Decision`: the event to
append, with a derived id and the entity key to guard), built by `Ctx`'s event builders.

A decision's id is `derive_id` of what it answers, never random: the same decision made twice
(a retry, a second controller, `motor replay --verify`) has the same `Nats-Msg-Id`, so
JetStream drops the copy and the replay can compare. The shell guards each append with the
last sequence it folded for the decision's own subject (`Decision.subject`).
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.heard import Hearing
from controller.state_queries import Index, build_index
from core import subjects
from core.config import ClusterConfig
from core.events import (
    AnyEvent,
    CausedBy,
    FaultCleared,
    FaultClearedData,
    FaultLevel,
    FaultReported,
    FaultReportedData,
    InstanceAssembled,
    InstanceAssembledData,
    InstanceRestated,
    InstanceRestatedData,
    InstanceState,
    InstanceStateChanged,
    InstanceStateChangedData,
    PrecisionAlarmCleared,
    PrecisionAlarmClearedData,
    StartCommand,
    StartCommandData,
    StopCommand,
    StopCommandData,
)
from core.ids import derive_id
from core.state import ClusterState, InstanceRecord, NodeRecord


@dataclass(frozen=True, slots=True)
class Decision:
    """One event the controller wants appended; guarded by its subject's folded last sequence."""

    event: AnyEvent

    @property
    def id(self) -> str:
        return self.event.id

    @property
    def subject(self) -> str:
        """The per-entity key the shell turns into `expected_last_subject_seq`."""
        return subjects.for_event(self.event)

    def summary(self) -> str:
        """A short human line: type, entity, reason."""
        data = self.event.data
        reason = getattr(data, "reason", "") or getattr(data, "message", "")
        entity = subjects.parse(self.subject).entity
        what = getattr(data, "state", None) or ""
        return f"{self.event.type} {entity} {what} {reason}".replace("  ", " ").strip()


@dataclass(frozen=True, slots=True)
class Cause:
    """The event a decision answers (stream seq + id) and the words an operator reads."""

    seq: int
    id: str
    reason: str

    def caused_by(self) -> CausedBy:
        return CausedBy(id=self.id, seq=self.seq or None)


@dataclass(frozen=True, slots=True)
class Ctx:
    """Everything one `decide` call looks at: the state, the config, the given time."""

    state: ClusterState
    cfg: ClusterConfig
    now: float
    idx: Index
    source: str = "controller"
    # What the controller heard of each node, on its monotonic clock (controller.heard): the
    # only basis of silence. None (a replay, a tool): nobody is judged silent.
    hearing: Hearing | None = None

    @classmethod
    def build(
        cls,
        state: ClusterState,
        cfg: ClusterConfig,
        now: float,
        source: str = "controller",
        hearing: Hearing | None = None,
    ) -> Ctx:
        return cls(state, cfg, now, build_index(state), source, hearing)

    @property
    def term(self) -> int:
        """The lease term of the leader deciding: its `controller.leader_changed` is folded
        before it decides (the appender waits for its own appends), so commands carry it."""
        leader = self.state.leader
        return leader.term if leader is not None else 0

    # ------------------------------------------------------------------ event builders

    def state_change(self, inst: InstanceRecord, to: InstanceState, cause: Cause) -> Decision:
        """Move an instance to `to`; the id names the state it leaves, so each move is unique.

        The cause is not part of the id: which of several reasons is named may change as a
        batch is folded, the move itself does not.
        """
        eid = derive_id("state", inst.instance_id, to, inst.state, inst.state_ts)
        data = InstanceStateChangedData(
            instance_id=inst.instance_id, state=to, previous=inst.state, reason=cause.reason
        )
        return Decision(
            InstanceStateChanged(
                id=eid, ts=self.now, source=self.source, caused_by=cause.caused_by(), data=data
            )
        )

    def stop(
        self,
        node: NodeRecord,
        instance_id: int | None,
        cause: Cause,
        tag: str = "stop",
        drain_timeout: float = 0.0,
    ) -> Decision:
        """Stop the node's engines (gracefully, finishing what they carry within `drain_timeout`,
        when it is > 0); the id names the start and the stop it follows (not the cause)."""
        node_id = node.node_id
        last_start = node.start_cmd.data.command_id if node.start_cmd is not None else ""
        last_stop = node.stop_cmd.data.command_id if node.stop_cmd is not None else ""
        cid = derive_id(tag, node_id, instance_id, last_start, last_stop)
        data = StopCommandData(
            command_id=cid,
            node_id=node_id,
            instance_id=instance_id,
            reason=cause.reason,
            term=self.term,
            drain_timeout=drain_timeout,
        )
        return Decision(
            StopCommand(id=cid, ts=self.now, source=self.source, caused_by=cause.caused_by(), data=data)
        )

    def start(
        self, inst: InstanceRecord, rank: int, attempt: int, cause: Cause, restarts: int = 0
    ) -> Decision:
        """Motor's StartCmdMsg for the member at `rank` of `inst`; `restarts`: crashes in a row it answers."""
        spec = inst.spec
        member = spec.members[rank]
        cid = derive_id("start", member.node_id, inst.instance_id, cause.id, attempt)
        data = StartCommandData(
            command_id=cid,
            node_id=member.node_id,
            instance_id=inst.instance_id,
            job_name=spec.job_name,
            role=spec.role,
            engine_type=spec.engine_type,
            model=spec.model,
            endpoints=member.endpoints,
            master_dp_ip=spec.master_dp_ip,
            node_rank=member.node_rank,
            nnodes=len(spec.members),
            d2d_peer_ips=member_peer_ips(spec, rank),
            attempt=attempt,
            restarts=restarts,
            term=self.term,
        )
        return Decision(
            StartCommand(id=cid, ts=self.now, source=self.source, caused_by=cause.caused_by(), data=data)
        )

    def assembled(self, data: InstanceAssembledData, cause: Cause, *key: object) -> Decision:
        eid = derive_id("assemble", data.instance_id, *key)
        return Decision(
            InstanceAssembled(id=eid, ts=self.now, source=self.source, caused_by=cause.caused_by(), data=data)
        )

    def restated(self, inst: InstanceRecord, cause: Cause) -> Decision:
        """Say the instance again as the fold holds it; the id names the statement it renews."""
        eid = derive_id("restate", inst.instance_id, inst.assembled_id, inst.assembled_ts, inst.restated_ts)
        data = InstanceRestatedData(
            instance_id=inst.instance_id,
            spec=inst.spec,
            state=inst.state,
            reason=inst.reason,
            state_ts=inst.state_ts,
            assembled_ts=inst.assembled_ts,
            active_ts=inst.active_ts,
        )
        return Decision(
            InstanceRestated(id=eid, ts=self.now, source=self.source, caused_by=cause.caused_by(), data=data)
        )

    def fault(
        self,
        fault_id: str,
        node_id: str,
        level: FaultLevel,
        code: str,
        message: str,
        instance_id: int,
        cause: Cause,
    ) -> Decision:
        data = FaultReportedData(
            fault_id=fault_id,
            node_id=node_id,
            level=level,
            code=code,
            message=message,
            instance_id=instance_id,
            kind="software",
        )
        return Decision(
            FaultReported(
                id=derive_id("fault", fault_id),
                ts=self.now,
                source=self.source,
                caused_by=cause.caused_by(),
                data=data,
            )
        )

    def fault_cleared(self, fault_id: str, node_id: str, fault_event_id: str, cause: Cause) -> Decision:
        data = FaultClearedData(fault_id=fault_id, node_id=node_id, reason=cause.reason)
        return Decision(
            FaultCleared(
                id=derive_id("fault-cleared", fault_event_id),
                ts=self.now,
                source=self.source,
                caused_by=cause.caused_by(),
                data=data,
            )
        )

    def alarm_cleared(
        self, d_instance_id: int, p_instance_id: int | None, alarm_id: str, alarm_event_id: str, cause: Cause
    ) -> Decision:
        data = PrecisionAlarmClearedData(
            d_instance_id=d_instance_id, p_instance_id=p_instance_id, alarm_id=alarm_id, reason=cause.reason
        )
        return Decision(
            PrecisionAlarmCleared(
                id=derive_id("alarm-cleared", alarm_event_id),
                ts=self.now,
                source=self.source,
                caused_by=cause.caused_by(),
                data=data,
            )
        )


def member_peer_ips(spec: InstanceAssembledData, rank: int) -> tuple[str, ...] | None:
    """The slice of the instance's `d2d_peer_ips` that belongs to the member at `rank`."""
    if not spec.d2d_peer_ips:
        return None
    offset = sum(len(m.endpoints) for m in spec.members[:rank])
    mine = spec.d2d_peer_ips[offset : offset + len(spec.members[rank].endpoints)]
    return tuple(mine) or None
