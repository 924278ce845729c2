"""One ordered lane for the agent's events: callers post (or send and wait), one task publishes.

Order matters (STARTING before READY before DEAD), and a status change must never wait for
NATS, so the supervisor posts and moves on; command results are sent and awaited, because
a command is acked only once its result is in the log. A publish that fails is retried with
backoff; the event id is fixed, so JetStream drops a copy that did land.

While NATS is away (timeouts, a lost connection) or its store is full (`StoreFull`: MOTOR at
its `nats.max_bytes`, the server's store at its cap) an event waits for as long as it takes. An
event the server itself refuses is retried for `reject_budget` seconds and then dropped
(`on_rejected_for_good`): one event the server will never take must not hold up every later
one. Whoever waits on it (`send`) gets the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.errors import Error as NatsError

from core.events import EventBase
from nodeagent.metrics import AgentMetrics
from streams.errors import PublishFailed, StoreFull, StreamsError
from streams.log import Appends

log = logging.getLogger(__name__)

REJECT_BUDGET = 30.0


class Outbox:
    def __init__(
        self,
        publisher: Appends,
        metrics: AgentMetrics,
        *,
        max_backoff: float = 5.0,
        reject_budget: float = REJECT_BUDGET,
    ) -> None:
        self.publisher = publisher
        self.metrics = metrics
        self.max_backoff = max_backoff
        self.reject_budget = reject_budget
        self._queue: asyncio.Queue[tuple[EventBase, asyncio.Future[int]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="outbox")

    def post(self, event: EventBase) -> asyncio.Future[int]:
        """Queue an event; the returned future gives its stream sequence once published."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((event, fut))
        return fut

    async def send(self, event: EventBase) -> int:
        """Queue an event and wait until it is in the log; return its stream sequence."""
        return await self.post(event)

    @property
    def pending(self) -> int:
        """Events queued and not yet published."""
        return self._queue.qsize()

    async def drain(self, within: float) -> None:
        """Wait (bounded) until everything queued so far is published."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._queue.join(), within)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while not self._queue.empty():
            _, fut = self._queue.get_nowait()
            if not fut.done():
                fut.cancel()

    async def _run(self) -> None:
        while True:
            event, fut = await self._queue.get()
            try:
                seq = await self._publish(event)
            except Exception as exc:
                self.on_rejected_for_good(event, exc)
                if not fut.done():
                    fut.set_exception(exc)
            else:
                if not fut.done():
                    fut.set_result(seq)
            finally:
                self._queue.task_done()

    async def _publish(self, event: EventBase) -> int:
        """Publish until it lands; raise once the server refused it for `reject_budget` seconds."""
        loop = asyncio.get_running_loop()
        delay = 0.1
        refused_since: float | None = None
        etype: str = event.type
        while True:
            try:
                return await self.publisher.publish(event)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                # nats-py cancels a pending request when its connection goes: not our stop.
                exc: Exception = StreamsError("publish cancelled by the NATS client")
            except StoreFull as full:
                # The store is full, not the event wrong: kept until the operator frees room.
                self.metrics.publishes_store_full.labels(self.metrics.node_id).inc()
                refused_since = None
                exc = full
            except PublishFailed as refused:
                now = loop.time()
                refused_since = now if refused_since is None else refused_since
                if now - refused_since >= self.reject_budget:
                    raise
                exc = refused
            except (StreamsError, NatsError, OSError) as away:
                refused_since = None  # NATS away: wait as long as it takes
                exc = away
            log.warning("publish %s %s failed (%s); retrying in %.1fs", etype, event.id, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.max_backoff)

    def on_rejected_for_good(self, event: EventBase, exc: Exception) -> None:
        """An event that cannot be published: log it with its id, count it, move on."""
        etype: str = event.type
        self.metrics.events_dropped.labels(self.metrics.node_id, etype).inc()
        log.error("event %s %s dropped, it cannot be published: %s", etype, event.id, exc)
