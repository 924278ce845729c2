"""CoordinatorContext: the one typed object holding a coordinator's state (no module globals).

The service makes it, feeds the log into it (`apply`, through `coordinator.feed`), whose fold
sets `caught_up` once it has replayed the log, and hands it to the proxy and to the
management app.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from coordinator.choose import any_path
from coordinator.metrics import CoordinatorMetrics
from coordinator.table import RoutingTable
from core.coordconfig import CoordinatorConfig
from core.events import AnyEvent, EventBase
from core.kvblocks import KvView


class EventPublisher(Protocol):
    """What the coordinator needs of `streams.publisher.Publisher`."""

    async def publish(self, event: EventBase, *, expected_last_subject_seq: int | None = None) -> int: ...


class LogPosition(Protocol):
    """What the context needs of the fold that feeds it (`streams.livefold.LiveFold`)."""

    caught_up_once: bool

    async def wait_for(self, seq: int, within: float) -> bool: ...


@dataclass(eq=False)
class CoordinatorContext:
    """Settings, routing table, publisher, metrics and the caught-up flag of one coordinator."""

    settings: CoordinatorConfig = field(default_factory=CoordinatorConfig)
    table: RoutingTable = field(default_factory=RoutingTable)
    metrics: CoordinatorMetrics = field(default_factory=CoordinatorMetrics)
    publisher: EventPublisher | None = None
    source: str = "coordinator"  # `source` of the events this coordinator appends
    caught_up: asyncio.Event = field(default_factory=asyncio.Event)
    started_at: float = field(default_factory=time.time)
    log: LogPosition | None = None  # the fold of the log feeding `apply` (coordinator.feed)
    # The proxy's per-request routing records (`proxy.record.Recorder`: `find(id)`), once built.
    recorder: Any = None
    draining: bool = False  # going away (SIGTERM): not ready, taking no new connection
    kv: KvView = field(default_factory=KvView)  # what each engine caches (coordinator.kvfeed)

    def __post_init__(self) -> None:
        self.metrics.bind_table(self.table, self.caught_up.is_set)

    def apply(self, event: AnyEvent | EventBase, seq: int = 0) -> None:
        """Fold one event into the table."""
        self.table.apply(event, seq)

    async def wait_applied(self, seq: int, within: float) -> bool:
        """Wait until the fold has handled MOTOR sequence `seq`; False on timeout or without a fold."""
        if self.log is None:
            return False
        return await self.log.wait_for(seq, within)

    def readiness(self) -> tuple[bool, str]:
        """(ready, reason): the table holds the log and some model has a usable route.

        Once caught up, a lost log does not make the coordinator unready: it serves from its
        table while the new log is folded on top (coordinator.feed).
        """
        if self.draining:
            return False, "draining: this replica is going away and takes no new request"
        held = self.caught_up.is_set() or (self.log is not None and self.log.caught_up_once)
        if not held:
            return False, "replaying the event log"
        models = self.table.models()
        if not models:
            return False, "no instance is registered"
        reasons = []
        for model in models:
            plan = self.table.plan(model)
            if plan.kind == "none":
                reasons.append(plan.reason)
            elif any_path(self.table, model) is not None:
                return True, ""
            else:
                reasons.append(f"{model}: every path has an endpoint with an open circuit")
        return False, "; ".join(reasons)
