"""Waiting for a node's engines to finish what they carry: the graceful half of a drain.

The coordinators stop routing to a draining instance as soon as they fold the drain; the
engines' own `/metrics` (requests running and waiting, the numbers heartbeats carry) say
when what was already sent has finished. Idle means no request for `settle` seconds in a
row, so one routed just before the drain was folded still lands and is waited for. An engine
that does not answer its metrics counts as idle: there is nothing to wait on that can be seen.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from core.ids import derive_id
from core.opsdata import DrainRequestedData
from nodeagent.engines import Engines
from nodeagent.settings import AgentSettings

POLL = 0.2


@dataclass(frozen=True, slots=True)
class Drained:
    idle: bool  # False: the timeout ran out with requests still on the engines
    waited: float
    left: int = 0  # requests running or waiting when it gave up

    def detail(self) -> str:
        if self.idle:
            return f"drained: engines idle after {self.waited:.1f}s"
        return f"drain timed out after {self.waited:.1f}s with {self.left} request(s) still on the engines"


async def wait_idle(
    engines: Engines,
    endpoint_ids: tuple[int, ...],
    within: float,
    settle: float,
    monotonic: Callable[[], float],
    poll: float = POLL,
) -> Drained:
    """Until the endpoints (all when empty) have had nothing running or waiting for `settle` s,
    at most `within` seconds."""
    start = monotonic()
    idle_since: float | None = None
    while True:
        eps = [
            ep
            for ep in engines.endpoints.values()
            if (not endpoint_ids or ep.spec.id in endpoint_ids) and ep.live and ep.serves_http
        ]
        loads = await asyncio.gather(*(engines.host.load(ep.url("/metrics"), 1.0) for ep in eps))
        busy = sum(x.running + x.waiting for x in loads if x is not None)
        now = monotonic()
        if busy == 0:
            idle_since = now if idle_since is None else idle_since
            if now - idle_since >= settle:
                return Drained(True, now - start)
        else:
            idle_since = None
        if now - start >= within:
            return Drained(busy == 0, now - start, busy)
        await asyncio.sleep(min(poll, max(0.0, within - (now - start))) or poll)


def sigterm_drain(s: AgentSettings, engines: Engines, source: str) -> DrainRequestedData | None:
    """The drain a node agent asks for on SIGTERM (None: nothing serves here, or it keeps its engines)."""
    timeout = s.config.nodeagent.drain_timeout
    iid = engines.instance_id
    if s.keep_engines or timeout <= 0 or iid is None or not engines.running_ids():
        return None
    return DrainRequestedData(
        drain_id=derive_id("drain-sigterm", s.node_id, iid, engines.start_seq),
        target="node",
        node_id=s.node_id,
        instance_id=iid,
        timeout=timeout,
        reason=f"node agent {s.node_id} stopping",
        cordon=False,
        requested_by=source,
    )
