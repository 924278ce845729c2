"""Fault reporter: polls each engine's `/fault_tolerance/status` and reports changes.

On when the engine config enables fault tolerance (or the section's `fault_tolerance.enabled`
says so, seed 002). Every `poll_interval` s (default 5) each serving engine is asked, each
request bounded by `poll_timeout` (default 5 s, its own limit, not the health check's).
`unhealthy` and `dead` (or `max_poll_failures` failed polls in a row while the process
lives) are reported at the level the fault-code table gives `engine_unhealthy` /
`engine_dead`; back to `healthy` clears it. One fault id per endpoint, engine incarnation
and code, so a repeated report is deduplicated by JetStream.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from core import faultcodes
from core.events import (
    EndpointStatus,
    EventBase,
    FaultCleared,
    FaultClearedData,
    FaultReported,
    FaultReportedData,
)
from core.ids import derive_id, new_id
from nodeagent.engines import Engines
from nodeagent.metrics import AgentMetrics
from nodeagent.settings import AgentSettings

log = logging.getLogger(__name__)

CODES = {"unhealthy": faultcodes.ENGINE_UNHEALTHY, "dead": faultcodes.ENGINE_DEAD}


@dataclass
class FaultTracker:
    """Per-endpoint memory of what was reported: emits only changes."""

    max_poll_failures: int = 3
    reported: str | None = None  # code currently reported ("engine_unhealthy"/"engine_dead")
    failures: int = 0

    def observe(self, status: str | None) -> list[tuple[str, str]]:
        """What to emit for one poll result: ("clear", code) and/or ("report", code) actions."""
        if status is None:
            self.failures += 1
            if self.failures < self.max_poll_failures:
                return []
            status = "dead"
        else:
            self.failures = 0
        code = None if status == "healthy" else CODES[status]
        if code == self.reported:
            return []
        actions: list[tuple[str, str]] = []
        if self.reported is not None:
            actions.append(("clear", self.reported))
        if code is not None:
            actions.append(("report", code))
        self.reported = code
        return actions


@dataclass
class FaultReporter:
    """Polls every serving engine of the node and posts `fault.reported` / `fault.cleared`."""

    settings: AgentSettings
    engines: Engines
    fault_status: Callable[[str, float], Awaitable[str | None]]  # EngineHost.fault_status
    post: Callable[[EventBase], object]
    metrics: AgentMetrics
    clock: Callable[[], float] = time.time
    trackers: dict[tuple[int, int], FaultTracker] = field(default_factory=dict)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.settings.poll_interval)
            await self.poll_once()

    async def poll_once(self) -> None:
        ft = self.settings.section.fault_tolerance
        for ep in list(self.engines.endpoints.values()):
            if (
                not ep.live
                or not ep.serves_http
                or ep.status not in (EndpointStatus.READY, EndpointStatus.ABNORMAL)
            ):
                continue
            # One tracker per engine incarnation: a restarted engine starts with a clean slate.
            tracker = self.trackers.setdefault((ep.spec.id, ep.proc.pid), FaultTracker(ft.max_poll_failures))
            status = await self.fault_status(ep.url("/fault_tolerance/status"), ft.poll_timeout)
            for action, code in tracker.observe(status):
                self._emit(action, code, ep.spec.id, ep.proc.pid)
        self.on_engine_gone()

    def on_engine_gone(self) -> None:
        """Clear what was reported of engines that no longer run (stopped, dead, replaced): a
        fault of a process that is gone would keep the node out of assembly for good, as the
        suicide watch's would (found by the simulator, tests/sim, seed 1217)."""
        live = {(ep.spec.id, ep.proc.pid) for ep in self.engines.endpoints.values() if ep.live}
        for key in [k for k in self.trackers if k not in live]:
            tracker = self.trackers.pop(key)
            if tracker.reported is not None:
                self._emit("clear", tracker.reported, *key, reason="the engine is gone: its fault with it")

    def _emit(
        self, action: str, code: str, endpoint_id: int, pid: int, reason: str = "engine reports healthy"
    ) -> None:
        node = self.settings.node_id
        source = f"nodeagent/{node}"
        fault_id = derive_id("fault", node, endpoint_id, pid, code)
        if action == "clear":
            cleared = FaultClearedData(fault_id=fault_id, node_id=node, reason=reason)
            self.post(FaultCleared(id=new_id(), ts=self.clock(), source=source, data=cleared))
            return
        self.metrics.faults.labels(node, code).inc()
        data = FaultReportedData(
            fault_id=fault_id,
            node_id=node,
            level=faultcodes.level_for(code),
            code=code,
            message=f"endpoint {endpoint_id}: /fault_tolerance/status reports {code.removeprefix('engine_')}",
            instance_id=self.engines.instance_id,
            endpoint_id=endpoint_id,
        )
        self.post(FaultReported(id=new_id(), ts=self.clock(), source=source, data=data))
