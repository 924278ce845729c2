"""A tiny in-memory log for controller tests: append events, fold, decide, play the node agents.

`Log` stands in for JetStream (sequence numbers, one total order) and `agent_*` methods for
what node agents report. Used by the decide tables and the property test; the integration
tests use the real parts.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from controller.decide import Decision, Hearing, decide
from controller.heard import note
from core.config import ClusterConfig, ControllerConfig, EngineSection, HealthCheckConfig
from core.events import (
    CommandApplied,
    CommandAppliedData,
    CommandRefused,
    CommandRefusedData,
    EndpointSpec,
    EndpointStatus,
    EndpointStatusChanged,
    EndpointStatusChangedData,
    EventBase,
    FaultCleared,
    FaultClearedData,
    FaultLevel,
    FaultReported,
    FaultReportedData,
    Heartbeat,
    HeartbeatData,
    InstanceState,
    LeaderChanged,
    LeaderChangedData,
    NodeDeregistered,
    NodeDeregisteredData,
    NodeRegistered,
    NodeRegisteredData,
    PrecisionAlarmRaised,
    PrecisionAlarmRaisedData,
    Role,
    SnapshotCheckpoint,
    SnapshotCheckpointData,
    SnapshotPhase,
)
from core.ids import derive_id
from core.reducer import apply
from core.state import ClusterState


def config(
    union: int = 0, prefill: int = 0, decode: int = 0, nnodes: int = 1, scale_p2d: bool = False, **ctrl: Any
) -> ClusterConfig:
    """A cluster config with short, test-friendly controller timings."""
    engine = {"nnodes": nnodes} if nnodes > 1 else {}
    hc = HealthCheckConfig(startup_timeout=20.0)

    def sec(n: int) -> EngineSection:
        return EngineSection(instances=n, engine_config=engine, health_check_config=hc)

    c = ControllerConfig(
        **{
            "heartbeat_timeout": 10.0,
            "terminate_after": 60.0,
            "start_timeout": 30.0,
            "start_attempts": 3,
            "scale_p2d": scale_p2d,
            **ctrl,
        }
    )
    return ClusterConfig(
        controller=c,
        union=sec(union) if union else None,
        prefill=sec(prefill) if prefill else None,
        decode=sec(decode) if decode else None,
    )


class Log:
    """Sequence numbers, a folded state and the clocks the test controls.

    `now` is the controller's wall clock and `steady` its monotonic one; they move together
    (`tick`) until a test steps the wall clock alone (`step_wall`). A node's events carry its
    own wall clock, `now + skew[node]`. As in the live fold, each registration or heartbeat
    is heard at `steady` (`heard`).
    """

    def __init__(self, cfg: ClusterConfig, now: float = 1000.0) -> None:
        self.cfg = cfg
        self.now = now
        self.steady = now  # the controller's monotonic clock (equal to `now` until stepped)
        self.skew: dict[str, float] = {}  # node id -> how far its wall clock is off the controller's
        # When the controller began to hear (reconnect, catch-up, takeover) and the last moment
        # heartbeats could land (None: now), on the steady clock.
        self.hearing_since = 0.0
        self.heard_until: float | None = None
        self.heard: dict[str, float] = {}
        self.seq = 0
        self.state = ClusterState()
        self.events: list[tuple[int, EventBase]] = []  # the MOTOR log
        self.folded: list[tuple[int, EventBase]] = []  # everything folded, heartbeats (seq 0) included
        self._n = 0

    # ------------------------------------------------------------------ log

    def add(self, ev: EventBase) -> int:
        self.seq += 1
        self.events.append((self.seq, ev))
        self.folded.append((self.seq, ev))
        self.state = apply(self.state, ev, self.seq)
        note(self.heard, self.state, ev, self.steady)
        return self.seq

    def _id(self, *parts: object) -> str:
        self._n += 1
        return derive_id("test", self._n, *parts)

    def hearing(self) -> Hearing:
        """What the live service hands decide: the steady clock and when each node was heard."""
        return Hearing(now=self.steady, since=self.hearing_since, until=self.heard_until, at=dict(self.heard))

    def decide(self, now: float | None = None) -> list[Decision]:
        return decide(self.state, self.cfg, self.now if now is None else now, hearing=self.hearing())

    def commit(self, decisions: Iterable[Decision]) -> list[Decision]:
        out = list(decisions)
        for d in out:
            self.add(d.event)
        return out

    def step(self) -> list[Decision]:
        """Decide once and append what was decided."""
        return self.commit(self.decide())

    def settle(self, rounds: int = 20) -> list[Decision]:
        """Decide and append until the controller has nothing more to say (at this `now`)."""
        out: list[Decision] = []
        for _ in range(rounds):
            ds = self.step()
            if not ds:
                return out
            out += ds
        raise AssertionError(f"decide did not settle: {[d.summary() for d in ds]}")

    def tick(self, seconds: float, *, heartbeats: bool = True) -> None:
        """Let time pass; by default every node keeps heartbeating (a healthy cluster)."""
        self.now += seconds
        self.steady += seconds
        if heartbeats:
            for nid in sorted(self.state.nodes):
                self.heartbeat(nid)

    def step_wall(self, seconds: float) -> None:
        """The controller's wall clock jumps (NTP, an operator); its monotonic clock does not."""
        self.now += seconds

    def node_ts(self, node_id: str) -> float:
        """The node's own wall clock: the `ts` of what it sends."""
        return self.now + self.skew.get(node_id, 0.0)

    # ------------------------------------------------------------------ what agents report

    def register(
        self,
        node_id: str,
        role: Role | str = Role.UNION,
        ip: str | None = None,
        eps: int = 1,
        engine_type: str = "builtin",
        **kw: Any,
    ) -> int:
        ip = ip or f"10.0.0.{len(self.state.nodes) + 1}"
        endpoints = tuple(
            EndpointSpec(id=i, ip=ip, business_port=9000 + i, mgmt_port=9000 + i) for i in range(eps)
        )
        data = NodeRegisteredData(
            node_id=node_id,
            job_name=kw.pop("job_name", "motor"),
            pod_ip=ip,
            role=Role(role),
            engine_type=engine_type,
            model="motor-sim",
            endpoints=endpoints,
            **kw,
        )
        return self.add(
            NodeRegistered(
                id=self._id("reg", node_id),
                ts=self.node_ts(node_id),
                source=f"nodeagent/{node_id}",
                data=data,
            )
        )

    def deregister(self, node_id: str) -> int:
        data = NodeDeregisteredData(node_id=node_id, reason="test")
        return self.add(NodeDeregistered(id=self._id("dereg"), ts=self.now, source="test", data=data))

    def heartbeat(self, node_id: str) -> None:
        """Heartbeats are folded with seq 0: they are not in the MOTOR log."""
        ev = Heartbeat(
            id=self._id("hb"),
            ts=self.node_ts(node_id),
            source=f"nodeagent/{node_id}",
            data=HeartbeatData(node_id=node_id),
        )
        self.folded.append((0, ev))
        self.state = apply(self.state, ev, 0)
        note(self.heard, self.state, ev, self.steady)

    def status(self, node_id: str, endpoint: int, status: EndpointStatus | str, reason: str = "") -> int:
        node = self.state.nodes[node_id]
        data = EndpointStatusChangedData(
            node_id=node_id,
            endpoint_id=endpoint,
            instance_id=node.instance_id,
            status=EndpointStatus(status),
            reason=reason,
        )
        return self.add(
            EndpointStatusChanged(id=self._id("eps"), ts=self.now, source=f"nodeagent/{node_id}", data=data)
        )

    def applied(self, node_id: str, verb: str = "start") -> int:
        node = self.state.nodes[node_id]
        cmd = node.start_cmd if verb == "start" else node.stop_cmd
        assert cmd is not None, f"{node_id} has no {verb} command"
        data = CommandAppliedData(
            command_id=cmd.data.command_id, node_id=node_id, verb=verb, instance_id=cmd.data.instance_id
        )
        return self.add(
            CommandApplied(id=self._id("ok"), ts=self.now, source=f"nodeagent/{node_id}", data=data)
        )

    def refused(
        self, node_id: str, code: str = "port_in_use", verb: str = "start", seen_term: int | None = None
    ) -> int:
        node = self.state.nodes[node_id]
        cmd = node.start_cmd if verb == "start" else node.stop_cmd
        assert cmd is not None
        data = CommandRefusedData(
            command_id=cmd.data.command_id,
            node_id=node_id,
            verb=verb,
            instance_id=cmd.data.instance_id,
            code=code,
            reason="test",
            seen_term=seen_term,
        )
        return self.add(
            CommandRefused(id=self._id("no"), ts=self.now, source=f"nodeagent/{node_id}", data=data)
        )

    def agents(self, *, ready: bool = True, only: Iterable[str] | None = None) -> None:
        """Every node agent handles its pending commands: stops applied, starts applied (+ READY)."""
        for nid in sorted(only if only is not None else self.state.nodes):
            node = self.state.nodes[nid]
            stop, start = node.stop_cmd, node.start_cmd
            if stop is not None and stop.status == "pending":
                self.applied(nid, "stop")
            if start is not None and start.status == "pending" and (stop is None or stop.seq < start.seq):
                self.applied(nid, "start")
                for ep in start.data.endpoints:  # type: ignore[union-attr]
                    self.status(nid, ep.id, EndpointStatus.STARTING)
                    if ready:
                        self.status(nid, ep.id, EndpointStatus.READY)

    def lead(self, term: int, leader_id: str = "c1") -> int:
        """A controller announces its reign of `term`."""
        prev = self.state.leader
        data = LeaderChangedData(leader_id=leader_id, previous=prev.leader_id if prev else None, term=term)
        return self.add(
            LeaderChanged(id=self._id("lead"), ts=self.now, source=f"controller/{leader_id}", data=data)
        )

    def fault(self, node_id: str, level: FaultLevel | str, code: str = "CardUnhealthy", **kw: Any) -> str:
        fid = self._id("fault", node_id)
        data = FaultReportedData(fault_id=fid, node_id=node_id, level=FaultLevel(level), code=code, **kw)
        self.add(FaultReported(id=self._id("fev"), ts=self.now, source="operator", data=data))
        return fid

    def clear_fault(self, fault_id: str) -> int:
        node_id = self.state.faults[fault_id].data.node_id
        data = FaultClearedData(fault_id=fault_id, node_id=node_id, reason="operator")
        return self.add(FaultCleared(id=self._id("fclr"), ts=self.now, source="operator", data=data))

    def alarm(self, d: int, p: int | None = None) -> int:
        data = PrecisionAlarmRaisedData(alarm_id=self._id("alarm"), d_instance_id=d, p_instance_id=p)
        return self.add(
            PrecisionAlarmRaised(id=self._id("aev"), ts=self.now, source="coordinator", data=data)
        )

    def snapshot(self, node_id: str, phase: SnapshotPhase | str) -> int:
        node = self.state.nodes[node_id]
        data = SnapshotCheckpointData(
            node_id=node_id, phase=SnapshotPhase(phase), instance_id=node.instance_id
        )
        return self.add(SnapshotCheckpoint(id=self._id("snap"), ts=self.now, source="x", data=data))

    # ------------------------------------------------------------------ questions

    def inst(self, iid: int) -> InstanceState | None:
        rec = self.state.instances.get(iid)
        return rec.state if rec is not None else None

    def types(self, decisions: Iterable[Decision]) -> list[str]:
        out = []
        for d in decisions:
            ev: Any = d.event
            extra = getattr(ev.data, "state", None) or getattr(ev.data, "node_id", None)
            out.append(f"{ev.type}:{extra}" if extra else ev.type)
        return out

    def bring_up(self) -> None:
        """Settle decisions and answer commands until nothing moves (a happy cluster)."""
        for _ in range(20):
            ds = self.settle()
            self.agents()
            if not ds and not self.decide():
                return
        raise AssertionError("cluster did not come up")
