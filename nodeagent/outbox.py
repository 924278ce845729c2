"""One ordered lane for the agent's events: callers post (or send and wait), one task publishes.

Order matters (STARTING before READY before DEAD), and a status change must never wait for
NATS, so the supervisor posts and moves on; command results are sent and awaited, because
a command is acked only once its result is in the log. A publish that fails is retried with
backoff; the event id is fixed, so JetStream drops a copy that did land.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.errors import Error as NatsError

from core.events import EventBase
from streams.errors import StreamsError
from streams.publisher import Publisher

log = logging.getLogger(__name__)


class Outbox:
    def __init__(self, publisher: Publisher, *, max_backoff: float = 5.0) -> None:
        self.publisher = publisher
        self.max_backoff = max_backoff
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
            delay = 0.1
            try:
                while True:
                    try:
                        seq = await self.publisher.publish(event)
                    except (StreamsError, NatsError, OSError) as exc:
                        log.warning("publish %s failed (%s); retrying in %.1fs", event.type, exc, delay)  # type: ignore[attr-defined]
                        await asyncio.sleep(delay)
                        delay = min(delay * 2, self.max_backoff)
                        continue
                    if not fut.done():
                        fut.set_result(seq)
                    break
            finally:
                self._queue.task_done()
