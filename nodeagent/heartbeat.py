"""Heartbeats on `motor.hb.<node>`: every endpoint's status and load, every interval.

Load comes from each engine's `/metrics` (running, waiting, KV usage -> free blocks). While
a container snapshot is pending the heartbeat says so, so the controller holds the instance
out of routing instead of reading the quiet engine as healthy.

Only the latest heartbeat matters: while NATS is away (disconnected, or not answering since a
heartbeat failed) a beat is dropped and counted instead of being buffered by the client, and
the first beat NATS answers again carries fresh load.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from nats.errors import Error as NatsError

from core.events import EndpointLoad, EndpointStatus, Heartbeat, HeartbeatData
from core.ids import new_id
from nodeagent.backends import backend_for
from nodeagent.engines import Endpoint, Engines
from nodeagent.host import EngineHost
from nodeagent.loadmetrics import Load
from nodeagent.metrics import AgentMetrics
from nodeagent.settings import AgentSettings
from streams.errors import StreamsError
from streams.log import Log

log = logging.getLogger(__name__)

_SCRAPED = (EndpointStatus.READY, EndpointStatus.ABNORMAL)


class Heartbeats:
    def __init__(
        self,
        settings: AgentSettings,
        motor: Log,
        host: EngineHost,
        engines: Engines,
        metrics: AgentMetrics,
        snapshot_pending: Callable[[], bool],
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.motor = motor
        self.settings = settings
        # A beat waits for its ack at most two intervals: a later beat says more than a late ack.
        ack_timeout = max(1.0, 2 * settings.heartbeat_interval)
        self.publisher = motor.publisher(ack_timeout=ack_timeout)
        self.host = host
        self.clock = clock
        self.monotonic = monotonic
        self.engines = engines
        self.metrics = metrics
        self.snapshot_pending = snapshot_pending
        self.capacity = backend_for(settings.section.engine_type).capacity(settings.section)
        self._failing = False
        self.on_beat: Callable[[HeartbeatData], None] | None = None  # sees every heartbeat sent

    async def run(self) -> None:
        interval = self.settings.heartbeat_interval
        while True:
            started = self.monotonic()
            await self.beat()
            await asyncio.sleep(max(0.0, interval - (self.monotonic() - started)))

    async def _load(self, ep: Endpoint) -> Load | None:
        if not ep.live or not ep.serves_http or ep.status not in _SCRAPED:
            return None
        timeout = min(self.settings.heartbeat_interval, 2.0)
        load = await self.host.load(ep.url("/metrics"), timeout)
        if load is not None:
            ep.load = load
        return load

    def payload(self, loads: list[tuple[Endpoint, Load | None]]) -> HeartbeatData:
        cap = self.capacity
        out = []
        for ep, load in loads:
            status = ep.status or EndpointStatus.STARTING
            if load is None:
                out.append(EndpointLoad(id=ep.spec.id, status=status))
                continue
            out.append(
                EndpointLoad(
                    id=ep.spec.id,
                    status=status,
                    avail_slots=load.avail_slots(cap),
                    avail_blocks=load.avail_blocks(cap),
                    running=load.running,
                    waiting=load.waiting,
                )
            )
        return HeartbeatData(
            node_id=self.settings.node_id,
            instance_id=self.engines.instance_id,
            endpoints=tuple(out),
            snapshot_pending=self.snapshot_pending(),
        )

    async def beat(self) -> None:
        """Publish one heartbeat now."""
        eps = sorted(self.engines.endpoints.values(), key=lambda e: e.spec.id)
        loads = await asyncio.gather(*(self._load(ep) for ep in eps))
        data = self.payload(list(zip(eps, loads, strict=True)))
        if self.on_beat is not None:
            self.on_beat(data)  # engine health, whether NATS hears this beat or not
        node = self.settings.node_id
        if not await self.nats_answers():
            self.metrics.heartbeats_dropped.labels(node).inc()
            if not self._failing:
                log.warning("NATS away: heartbeats dropped until it answers")
            self._failing = True
            return
        hb = Heartbeat(id=new_id(), ts=self.clock(), source=f"nodeagent/{node}", data=data)
        try:
            await self.publisher.publish(hb)
        except (StreamsError, NatsError, OSError) as exc:
            self.metrics.heartbeat_failures.labels(node).inc()
            if not self._failing:
                log.warning("heartbeat not published: %s", exc)
            self._failing = True
            return
        if self._failing:
            log.info("heartbeats flowing again")
        self._failing = False
        self.metrics.heartbeats.labels(node).inc()

    async def nats_answers(self) -> bool:
        """Connected, and (after a failed beat) answering a PING within one interval."""
        if not self.motor.connected:
            return False
        if not self._failing:
            return True
        return await self.motor.answers(max(1.0, self.settings.heartbeat_interval))
