"""The memory log's ordered consumer: `streams.consumer.PushConsumer`'s promises, kept in memory.

Every message of the range once, in order, with what is pending after it. What a push
consumer does when the connection goes is kept too, because `LiveFold` leans on it: a link
down for three idle heartbeats, or messages published while it was down (JetStream pushed
them into a dead connection: a gap), makes the consumer start again after the last message it
handed out, retrying every 0.1 s doubling to 2 s until the server answers; `on_start` says so
each time. A server restart takes the consumer with it (memory storage, as Motor's folds
ask): nothing more is delivered, and three idle heartbeats later the client starts again. A stream deleted under it is `StreamMissing` at the restart, one created again since
reading began (`expect_created`) `StreamReplaced`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from typing import Protocol, TypeVar

from streams.consumer import MAX_RETRY_DELAY
from streams.errors import StreamsError
from streams.log import API_TIMEOUT, Delivery, StreamMissing, StreamReplaced
from streams.memory.link import Link
from streams.memory.server import MemoryServer
from streams.memory.store import MemStream

T = TypeVar("T")


class Client(Protocol):
    """What a consumer needs of its client (`client.MemoryLog`): the server, the link to it,
    and a question asked over that link."""

    server: MemoryServer
    link: Link

    async def ask(self, op: Callable[[], T], within: float, what: str) -> T: ...


BATCH = 256  # messages in one delivery at most


class MemoryOrdered:
    """An ordered consumer of one memory stream."""

    def __init__(
        self,
        log: Client,
        stream: str,
        *,
        start_seq: int | None = None,
        start_time: float | None = None,
        filter_subject: str | None = None,
        idle_heartbeat: float = 2.0,
        expect_created: str | None = None,
    ) -> None:
        self.log = log
        self.stream = stream
        self.start_seq = start_seq
        self.start_time = start_time
        self.filter_subject = filter_subject
        self.idle_heartbeat = idle_heartbeat
        self.expect_created = expect_created
        self.on_start: Callable[[int], None] | None = None
        self.last_seq = 0
        self.resets = 0
        self.delivering = False
        self._cursor = 0  # the last sequence not wanted (handed out, or before the start)
        self._epoch = -1  # the server's restarts when this consumer was made
        self._stream: MemStream | None = None
        self._wake = asyncio.Event()
        self._closed = False

    async def start(self) -> int:
        server, filt = self.log.server, self.filter_subject

        def begin() -> tuple[MemStream, int, int]:
            s = server.stream(self.stream)
            if self.expect_created is not None and s.created != self.expect_created:
                raise StreamReplaced(
                    f"stream {self.stream} was created again ({s.created}, read since {self.expect_created})"
                )
            if self.last_seq:
                cursor = self.last_seq
            elif self.start_seq is not None:
                cursor = max(1, self.start_seq) - 1
            elif self.start_time is not None:
                cursor = s.first_at_or_after(self.start_time) - 1
            else:
                cursor = 0
            return s, cursor, s.count_after(cursor, filt)

        s, self._cursor, pending = await self.log.ask(begin, API_TIMEOUT, f"consumer on {self.stream}")
        self._epoch = server.epoch
        self._attach(s)
        if self.on_start is not None:
            self.on_start(pending)
        return pending

    async def next_batch(self) -> list[Delivery]:
        link = self.log.link
        while not self._closed:
            s = self._stream
            if s is None or s.deleted:
                await self._reset("no consumer" if s is None else "consumer deleted")
                continue
            if self._epoch != self.log.server.epoch:
                # The server restarted: this consumer is gone with it, nothing is delivered,
                # and the client notices when three idle heartbeats have not come.
                await asyncio.sleep(3 * self.idle_heartbeat)
                await self._reset("no heartbeat (the server restarted)")
                continue
            if not link.up:
                before = s.last_seq
                if not await self._wait_up():
                    await self._reset("no heartbeat")
                    continue
                if s.last_seq > before:
                    await self._reset("gap: messages went to a dead connection")
                    continue
            batch = self._take(s)
            if batch:
                arrived = await link.arrive()
                if self._closed or self._stream is not s:
                    continue
                if not arrived:  # lost on the way: the next delivery shows a gap
                    await self._reset("gap: a delivery was lost")
                    continue
                self._cursor = self.last_seq = batch[-1].seq
                return batch
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(3 * self.idle_heartbeat):
                    await self._wake.wait()
        return []

    def _take(self, s: MemStream) -> list[Delivery]:
        filt = self.filter_subject
        total = s.count_after(self._cursor, filt)
        return [
            Delivery(m.seq, total - i - 1, int(m.ts * 1e9), m.subject, m.data)
            for i, m in enumerate(itertools.islice(s.after(self._cursor, filt), BATCH))
        ]

    async def _wait_up(self) -> bool:
        """Wait for the link; False when it stayed down for three idle heartbeats."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 3 * self.idle_heartbeat
        while not self.log.link.up and not self._closed:
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._wake.wait()
        return True

    async def _reset(self, why: str) -> None:
        self.resets += 1
        self._detach()
        delay = 0.1
        while not self._closed:
            try:
                await self.start()
                return
            except (StreamMissing, StreamReplaced):
                raise  # not transient: the caller decides (LiveFold waits for the stream)
            except StreamsError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)

    def _attach(self, s: MemStream) -> None:
        self._detach()
        self._stream = s
        s.listeners[self._wake] = None
        self.log.link.listen(self._wake)
        self.delivering = True

    def _detach(self) -> None:
        self.delivering = False
        if self._stream is not None:
            self._stream.listeners.pop(self._wake, None)
            self._stream = None
        self.log.link.unlisten(self._wake)

    async def close(self) -> None:
        self._closed = True
        self._wake.set()
        self._detach()
