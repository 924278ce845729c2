"""The coordinator's fault decisions, appended to the log so a client's experience can be explained.

Circuits are recorded as they open and close (`coordinator.circuit_changed`, with the
incarnation they belong to); stream outcomes — broken mid-stream, continued elsewhere,
failed, requests retried before their first byte — are counted per endpoint and written once
per window (`coordinator.streams_disrupted`), so a storm of a thousand broken streams is one
event per endpoint and second.

Nothing here may slow or fail a request: events go to a `FaultOutbox`, a bounded queue drained by
one background task; when NATS is away the task retries the oldest event with backoff (its id
is fixed, so a publish that did land is deduplicated) and new events wait in the queue until
it is full, after which they are dropped and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import Counter

from coordinator.breaker import BreakerState, CircuitChange
from coordinator.table import RoutingTable
from core.bounds import MAX_COUNT, MAX_TIMESTAMP
from core.events import (
    CircuitChanged,
    CircuitChangedData,
    EventBase,
    Role,
    StreamsDisrupted,
    StreamsDisruptedData,
)
from core.ids import new_id
from core.requestlog import RequestRecorded

log = logging.getLogger(__name__)

FaultEvent = CircuitChanged | StreamsDisrupted | RequestRecorded  # the last to MOTOR_REQ

WINDOW = 1.0  # seconds of stream outcomes per event and endpoint
QUEUE = 1024  # events waiting for NATS before new ones are dropped
RETRY_MAX = 5.0  # seconds between attempts to publish the oldest event while NATS is away


class EventPublisher(Protocol):
    """What the outbox needs of `streams.publisher.Publisher`."""

    async def publish(self, event: EventBase, *, expected_last_subject_seq: int | None = None) -> int: ...


class FaultOutboxMetrics(Protocol):
    """The counters the outbox keeps (see `coordinator.metrics`)."""

    fault_events: Counter
    fault_events_dropped: Counter


class FaultOutbox:
    """Publishes events off the hot path; `post` never blocks and never raises."""

    def __init__(
        self, publisher: EventPublisher, *, capacity: int = QUEUE, metrics: FaultOutboxMetrics | None = None
    ) -> None:
        self.publisher = publisher
        self.metrics = metrics
        self._queue: asyncio.Queue[FaultEvent] = asyncio.Queue(capacity)
        self._task: asyncio.Task[None] | None = None
        self.published = 0
        self.dropped = 0

    def post(self, event: FaultEvent) -> bool:
        """Queue `event` for publishing; False (and counted) when the queue is full."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="fault-outbox")
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            self.dropped += 1
            if self.metrics is not None:
                self.metrics.fault_events_dropped.labels(reason="queue_full").inc()
            if self.dropped == 1 or self.dropped % 100 == 0:
                log.warning(
                    "fault event %s dropped: %d waiting for NATS (%d dropped)",
                    event.type,
                    QUEUE,
                    self.dropped,
                )
            return False
        return True

    @property
    def pending(self) -> int:
        """Events waiting to be published."""
        return self._queue.qsize()

    async def _run(self) -> None:
        while True:
            event = await self._queue.get()
            delay = 0.25
            while True:
                try:
                    seq = await self.publisher.publish(event)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # NATS away, slow or refusing: wait, then the same event again
                    log.warning(
                        "could not append %s %s (retrying in %.1f s): %s", event.type, event.id, delay, exc
                    )
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, RETRY_MAX)
                    continue
                self.published += 1
                if self.metrics is not None:
                    self.metrics.fault_events.labels(type=event.type).inc()
                log.debug("appended %s at seq %d", event.type, seq)
                break
            self._queue.task_done()

    async def close(self, within: float = 2.0) -> None:
        """Give queued events a moment to go out, then stop."""
        if self._task is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), within)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@dataclass(slots=True)
class _Window:
    since: float
    broken: int = 0
    continued: int = 0
    failed: int = 0
    retried: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    continued_on: dict[str, int] = field(default_factory=dict)


def _bump(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1


class FaultLog:
    """Turns circuit changes and stream outcomes into events for the outbox."""

    def __init__(
        self,
        table: RoutingTable,
        emit: Callable[[FaultEvent], object],
        *,
        coordinator: str,
        source: str,
        window: float = WINDOW,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.table = table
        self.emit = emit
        self.coordinator = coordinator
        self.source = source
        self.window = window
        self.clock = clock
        self._windows: dict[str, _Window] = {}
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------------ circuits

    def circuit(self, change: CircuitChange) -> None:
        """A circuit opened or closed: one event now (circuits change rarely by construction)."""
        if change.state == BreakerState.HALF_OPEN:
            return
        where = self._where(change.key)
        inc = self.table.incarnation(change.key)
        data = CircuitChangedData(
            coordinator=self.coordinator,
            **where,
            state="open" if change.state == BreakerState.OPEN else "closed",
            reason=change.reason,
            # At most what an event may carry (`core.bounds`): a breaker configured without an
            # upper bound (`backoff_max: .inf`) must not make the request that opened it raise.
            failures=min(change.failures, MAX_COUNT),
            backoff_s=min(change.backoff, MAX_TIMESTAMP),
            pid=inc.pid if inc is not None else None,
            ready_seq=inc.ready_seq if inc is not None else None,
        )
        self.emit(CircuitChanged(id=new_id(), ts=self.clock(), source=self.source, data=data))

    # ------------------------------------------------------------------ streams

    def broken(self, key: str, reason: str) -> None:
        """A stream on `key` broke after its first byte (its engine died, stalled or cut it)."""
        w = self._window(key)
        w.broken += 1
        _bump(w.reasons, reason)

    def continued(self, key: str, on: str | None) -> None:
        """A stream broken on `key` goes on: on endpoint `on`, or it had already ended (None)."""
        w = self._window(key)
        w.continued += 1
        if on is not None:
            _bump(w.continued_on, on)

    def failed(self, key: str) -> None:
        """A stream broken on `key` could not go on: cut, or no path was left."""
        self._window(key).failed += 1

    def retried(self, key: str, reason: str) -> None:
        """A request failed on `key` before its first byte and was tried elsewhere."""
        w = self._window(key)
        w.retried += 1
        _bump(w.reasons, reason)

    def _window(self, key: str) -> _Window:
        w = self._windows.get(key)
        if w is None:
            w = self._windows[key] = _Window(self.clock())
            if self._timer is None:
                with contextlib.suppress(RuntimeError):  # no loop (a pure test): flush() by hand
                    self._timer = asyncio.get_running_loop().call_later(self.window, self.flush)
        return w

    def flush(self) -> None:
        """Emit one event per endpoint for the window that just ended."""
        self._timer = None
        windows, self._windows = self._windows, {}
        until = self.clock()
        for key, w in sorted(windows.items()):
            data = StreamsDisruptedData(
                coordinator=self.coordinator,
                **self._where(key),
                since=w.since,
                until=until,
                broken=w.broken,
                continued=w.continued,
                failed=w.failed,
                retried=w.retried,
                reasons=w.reasons,
                continued_on=w.continued_on,
            )
            self.emit(StreamsDisrupted(id=new_id(), ts=until, source=self.source, data=data))

    def _where(self, key: str) -> dict[str, Any]:
        """The endpoint's identity fields: key, node and endpoint id, instance, role."""
        ep = self.table.endpoint(key)
        node_id: str | None = None
        endpoint_id: int | None = None
        if not key.startswith("ext/"):
            node, _, eid = key.rpartition("/")
            node_id = node
            endpoint_id = int(eid) if eid.isascii() and eid.isdigit() else None
        role: Role | None = ep.role if ep is not None else None
        return {
            "endpoint": key,
            "node_id": node_id,
            "endpoint_id": endpoint_id,
            "instance_id": ep.instance_id if ep is not None else None,
            "role": role,
        }
