"""The fault reporter forgets an engine that is gone: what it reported of it is cleared
(regression: the simulator's seed 1217, where a node whose engine was reported dead and then
stopped stayed out of assembly for good)."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

from core.config import ClusterConfig, EngineSection, NodeAgentConfig
from core.events import FaultCleared, FaultReported, Role
from nodeagent.engines import Engines
from nodeagent.faults import FaultReporter, FaultTracker
from nodeagent.metrics import AgentMetrics
from nodeagent.settings import AgentSettings
from tests.sim.engines import Machine


def test_a_fault_of_an_engine_that_is_gone_is_cleared(tmp_path: Path) -> None:
    async def main() -> list[object]:
        cfg = ClusterConfig(nodeagent=NodeAgentConfig(fault_reporter=True), union=EngineSection())
        settings = AgentSettings(config=cfg, node_id="n1", role=Role.UNION, ip="10.0.0.1", log_dir=tmp_path)
        machine = Machine("n1", random.Random(1), [1000])
        engines = Engines(settings, machine, lambda c: None)
        posted: list[object] = []
        reporter = FaultReporter(settings, engines, machine.fault_status, posted.append, AgentMetrics("n1"))
        tracker = reporter.trackers[(0, 4242)] = FaultTracker(max_poll_failures=1)
        for action, code in tracker.observe(None):  # no answer: reported dead
            reporter._emit(action, code, 0, 4242)
        await reporter.poll_once()  # engine 4242 runs no more here
        await reporter.poll_once()  # and is forgotten: cleared once
        return posted

    posted = asyncio.run(main())
    assert [type(e) for e in posted] == [FaultReported, FaultCleared]
    reported, cleared = posted
    assert cleared.data.fault_id == reported.data.fault_id  # type: ignore[attr-defined]
    assert "gone" in cleared.data.reason  # type: ignore[attr-defined]
