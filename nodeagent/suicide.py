"""The node declares itself failed after N consecutive abnormal heartbeats (seed 002 "suicide").

MindIE's `HeartbeatManager` counts heartbeats that carry an ABNORMAL endpoint; at 5 in a row
the NodeManager exits so Kubernetes reschedules the pod; a heartbeat without one, or a new
start command, resets the count. Here the node stays up and says the same thing in the log:
`fault.reported` with code `NODE_SUICIDE` at the fault-code table's level (L5: the controller
isolates the instance, stops it and rebuilds it from other nodes). Once the controller has
stopped this node's engines the agent clears its own fault, so the node rejoins the pool
fresh, as a restarted pod would.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from core import faultcodes
from core.events import (
    EndpointStatus,
    EventBase,
    FaultCleared,
    FaultClearedData,
    FaultReported,
    FaultReportedData,
    HeartbeatData,
)
from core.ids import derive_id, new_id
from nodeagent.engines import Engines
from nodeagent.metrics import AgentMetrics
from nodeagent.settings import AgentSettings

log = logging.getLogger(__name__)


@dataclass
class AbnormalStreak:
    """Pure counter: `observe` is True exactly on the heartbeat that reaches `threshold`."""

    threshold: int
    count: int = 0

    def observe(self, abnormal: bool) -> bool:
        """Count one heartbeat; True when this one makes `threshold` abnormal in a row."""
        if not abnormal:
            self.count = 0
            return False
        self.count += 1
        return self.count == self.threshold


@dataclass
class SuicideWatch:
    """Feeds each heartbeat to the streak; declares the node failed, then clears it when idle."""

    node_id: str
    threshold: int
    post: Callable[[EventBase], object]
    metrics: AgentMetrics
    start_seq: Callable[[], int]  # the start command the engines answer: a new one resets
    clock: Callable[[], float] = time.time  # wall time of the events (the simulator's, in tests/sim)
    streak: AbnormalStreak | None = None
    declared: str | None = None  # fault id while the node is declared failed
    _seq: int = -1

    def __post_init__(self) -> None:
        self.streak = AbnormalStreak(self.threshold)

    def on_beat(self, hb: HeartbeatData) -> None:
        """Look at one heartbeat as it is sent."""
        assert self.streak is not None
        if self.declared is not None:
            if not any(e.status != EndpointStatus.STOPPED for e in hb.endpoints):
                self._clear()
            return
        seq = self.start_seq()
        if seq != self._seq:
            self._seq, self.streak.count = seq, 0
        abnormal = [e.id for e in hb.endpoints if e.status == EndpointStatus.ABNORMAL]
        crossed = self.streak.observe(bool(abnormal))
        self.metrics.abnormal_streak.labels(self.node_id).set(self.streak.count)
        if abnormal and not crossed:
            log.warning(
                "consecutive abnormal heartbeat count %d/%d (endpoints %s)",
                self.streak.count,
                self.threshold,
                abnormal,
            )
        if crossed:
            self._declare(hb, abnormal)

    def _declare(self, hb: HeartbeatData, abnormal: list[int]) -> None:
        code = faultcodes.NODE_SUICIDE
        fault_id = derive_id("suicide", self.node_id, hb.instance_id, self._seq)
        msg = (
            f"{self.threshold} consecutive heartbeats with ABNORMAL endpoints {abnormal}: "
            "the node declares itself failed"
        )
        log.error("node %s: %s (instance %s, start seq %d)", self.node_id, msg, hb.instance_id, self._seq)
        self.metrics.faults.labels(self.node_id, code).inc()
        data = FaultReportedData(
            fault_id=fault_id,
            node_id=self.node_id,
            level=faultcodes.level_for(code),
            code=code,
            message=msg,
            instance_id=hb.instance_id,
            kind="software",
        )
        self.post(FaultReported(id=new_id(), ts=self.clock(), source=f"nodeagent/{self.node_id}", data=data))
        self.declared = fault_id

    def _clear(self) -> None:
        assert self.declared is not None and self.streak is not None
        log.info("node %s: engines stopped after declaring itself failed; rejoining", self.node_id)
        data = FaultClearedData(
            fault_id=self.declared, node_id=self.node_id, reason="engines stopped: the node is fresh again"
        )
        self.post(FaultCleared(id=new_id(), ts=self.clock(), source=f"nodeagent/{self.node_id}", data=data))
        self.declared = None
        self.streak.count = 0
        self.metrics.abnormal_streak.labels(self.node_id).set(0)


def suicide_watch(
    settings: AgentSettings,
    engines: Engines,
    post: Callable[[EventBase], object],
    metrics: AgentMetrics,
    clock: Callable[[], float] = time.time,
) -> SuicideWatch:
    """The watch for this agent: its node, the configured threshold, its engines' start."""
    return SuicideWatch(
        settings.node_id,
        settings.config.nodeagent.suicide_threshold,
        post,
        metrics,
        lambda: engines.start_seq,
        clock,
    )
