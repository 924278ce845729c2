"""`MemoryLog`: the `streams.log.Log` of one client of a `MemoryServer`, over a `Link`.

Everything goes through the link, as everything of `JetStreamLog` goes through its socket: a
request that gets no answer in time fails as JetStream's does (`PublishTimeout` for an
append, a `StreamsError` for a question) even when it took effect at the server. Appends are
encoded and headed exactly as `streams.publisher.Publisher` does (`headers_for`, one fallback
policy for batches in `streams.batch.publish_in_chunks`), so the server judges the same bytes.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TypeVar

from core import subjects
from core.codec import encode
from core.config import NatsConfig
from core.events import EventBase
from streams.batch import ATOMIC_DISABLED, NOT_AS_A_BATCH, publish_in_chunks
from streams.definitions import LEASE_TTL
from streams.errors import PublishFailed, PublishTimeout, SequenceConflict, StreamsError
from streams.log import API_TIMEOUT, Delivery, KVEntry, Message, Range
from streams.lostlog import StreamView
from streams.memory.durables import GONE, ConsumerGone, DurableState
from streams.memory.link import DirectLink, Link
from streams.memory.ordered import MemoryOrdered
from streams.memory.server import MemoryServer
from streams.memory.store import Refused
from streams.publisher import WRONG_LAST_SEQUENCE, headers_for

T = TypeVar("T")

PULL_MARGIN = 0.001  # seconds a pull request expires at the server before its fetch gives up


def _refused(exc: Refused, subject: str, expected: int | None) -> StreamsError:
    if exc.code == WRONG_LAST_SEQUENCE and expected is not None:
        return SequenceConflict(subject, expected, f"({exc.description})")
    return PublishFailed(f"{subject}: {exc.description}")


class MemoryLog:
    """One client's view of a memory server."""

    def __init__(self, server: MemoryServer, link: Link | None = None, *, name: str = "client") -> None:
        self.server = server
        self.link: Link = link if link is not None else DirectLink()
        self.name = name
        self.closed = False

    async def ask(self, op: Callable[[], T], within: float, what: str) -> T:
        """Run `op` at the server; a StreamsError when no answer came within `within` seconds."""
        if self.closed:
            raise StreamsError(f"{what}: connection closed")
        try:
            return await self.link.call(op, within)
        except TimeoutError:
            raise StreamsError(f"{what}: no answer within {within:g}s") from None

    @property
    def connected(self) -> bool:
        return self.link.up and not self.closed

    @property
    def reconnects(self) -> int:
        return self.link.reconnects

    async def answers(self, within: float) -> bool:
        try:
            await self.ask(lambda: None, within, "ping")
        except StreamsError:
            return False
        return True

    async def ensure_streams(
        self, cfg: NatsConfig | None = None, *, lease_ttl: float = LEASE_TTL, update: bool = True
    ) -> None:
        await self.ask(
            lambda: self.server.ensure_streams(cfg, lease_ttl=lease_ttl, update=update),
            API_TIMEOUT,
            "ensure the streams",
        )

    async def stream_info(self, stream: str, *, wait: float = API_TIMEOUT) -> StreamView:
        return await self.ask(lambda: self.server.view(stream), wait, f"STREAM.INFO {stream}")

    async def last_subject_seq(self, stream: str, subject: str) -> int:
        return await self.ask(
            lambda: self.server.last_subject_seq(stream, subject), API_TIMEOUT, f"last message of {subject}"
        )

    async def message(self, stream: str, seq: int) -> Delivery | None:
        def get() -> Delivery | None:
            m = self.server.stream(stream).get(seq)
            return None if m is None else Delivery(m.seq, 0, int(m.ts * 1e9), m.subject, m.data)

        return await self.ask(get, API_TIMEOUT, f"message {seq} of {stream}")

    def publisher(self, *, ack_timeout: float = 5.0) -> MemoryPublisher:
        return MemoryPublisher(self, ack_timeout)

    def ordered(
        self,
        stream: str,
        *,
        start_seq: int | None = None,
        start_time: float | None = None,
        filter_subject: str | None = None,
        idle_heartbeat: float = 2.0,
        expect_created: str | None = None,
    ) -> MemoryOrdered:
        return MemoryOrdered(
            self,
            stream,
            start_seq=start_seq,
            start_time=start_time,
            filter_subject=filter_subject,
            idle_heartbeat=idle_heartbeat,
            expect_created=expect_created,
        )

    async def durable(
        self,
        stream: str,
        name: str,
        *,
        filter_subject: str,
        ack_wait: float,
        max_ack_pending: int = 1,
        start_time: float | None = None,
    ) -> MemoryDurable:
        state = await self.ask(
            lambda: self.server.bind_durable(
                stream,
                name,
                filter_subject=filter_subject,
                ack_wait=ack_wait,
                max_ack_pending=max_ack_pending,
                start_time=start_time,
            ),
            API_TIMEOUT,
            f"binding consumer {name}",
        )
        return MemoryDurable(self, state)

    def kv(self, bucket: str) -> MemoryKV:
        return MemoryKV(self, bucket)

    async def read(self, stream: str, span: Range) -> AsyncIterator[list[Delivery]]:
        s = await self.ask(lambda: self.server.stream(stream), API_TIMEOUT, f"reading {stream}")
        end = s.last_seq if span.until_seq is None else min(span.until_seq, s.last_seq)
        if span.start_seq is not None:
            cursor = max(1, span.start_seq) - 1
        elif span.start_time is not None:
            cursor = s.first_at_or_after(span.start_time) - 1
        else:
            cursor = 0
        until_ns = int(span.until_time * 1e9) if span.until_time is not None else None
        while not s.deleted:
            total = s.count_after(cursor, span.filter_subject)
            batch = []
            for i, m in enumerate(itertools.islice(s.after(cursor, span.filter_subject), 256)):
                ts_ns = int(m.ts * 1e9)
                if m.seq > end or (until_ns is not None and ts_ns > until_ns):
                    break
                batch.append(Delivery(m.seq, total - i - 1, ts_ns, m.subject, m.data))
            if not batch:
                return
            yield batch
            cursor = batch[-1].seq
            if cursor >= end or len(batch) < min(256, total):
                return
            await asyncio.sleep(0)

    async def close(self) -> None:
        self.closed = True
        self.server.forget_client(self)


class MemoryPublisher:
    """Appends through one client, as `streams.publisher.Publisher` does through nats-py."""

    def __init__(self, log: MemoryLog, ack_timeout: float) -> None:
        self.log = log
        self.ack_timeout = ack_timeout
        self._atomic: bool | None = None  # whether the stream takes atomic batches (None: not tried)

    async def publish(
        self,
        event: EventBase,
        *,
        expected_last_subject_seq: int | None = None,
        expected_subject: str | None = None,
    ) -> int:
        subject = subjects.for_event(event)
        hdr = headers_for(event, expected_last_subject_seq, expected_subject)
        data = encode(event)
        try:
            _, seq, _ = await self.log.link.call(
                lambda: self.log.server.publish(subject, data, hdr), self.ack_timeout
            )
        except TimeoutError:
            raise PublishTimeout(f"{subject}: no ack within {self.ack_timeout}s") from None
        except Refused as exc:
            raise _refused(exc, expected_subject or subject, expected_last_subject_seq) from None
        return seq

    async def publish_batch(
        self,
        events: Sequence[EventBase],
        *,
        expected_last_subject_seq: int | None = None,
        expected_subject: str | None = None,
        go_on: Callable[[], bool] | None = None,
    ) -> list[int | StreamsError]:
        return await publish_in_chunks(
            events,
            atomic=lambda chunk: self._atomic_batch(chunk, expected_last_subject_seq, expected_subject),
            one=lambda event: self.publish(
                event, expected_last_subject_seq=expected_last_subject_seq, expected_subject=expected_subject
            ),
            go_on=go_on,
        )

    async def _atomic_batch(
        self, events: Sequence[EventBase], expected: int | None, guard: str | None
    ) -> list[int | StreamsError] | None:
        if self._atomic is False:
            return None
        items = [(subjects.for_event(e), encode(e), headers_for(e, expected, guard)) for e in events]
        first = items[0][0]
        try:
            _, seqs = await self.log.link.call(lambda: self.log.server.publish_batch(items), self.ack_timeout)
        except TimeoutError:
            # All of it landed or none of it: the next decide finds out from the log.
            return [PublishTimeout(f"{first}: no ack of a batch within {self.ack_timeout}s")] * len(events)
        except Refused as exc:
            if exc.code in NOT_AS_A_BATCH:
                if exc.code == ATOMIC_DISABLED:
                    self._atomic = False
                return None
            return [_refused(exc, guard or first, expected)] * len(events)
        self._atomic = True
        return list(seqs)


class MemoryMessage:
    """One delivery of a durable consumer's message."""

    def __init__(self, durable: MemoryDurable, subject: str, data: bytes, seq: int, delivered: int) -> None:
        self.durable = durable
        self.subject, self.data, self.seq, self.delivered = subject, data, seq, delivered

    async def ack(self, within: float) -> None:
        state = self.durable.state

        def ack() -> None:
            if state.gone:  # JetStream: no consumer answers an ack
                raise ConsumerGone(f"consumer {state.name} was deleted")
            state.ack(self.seq)

        await self.durable.log.link.call(ack, within)

    async def nak(self, delay: float | None = None) -> None:
        state = self.durable.state
        self.durable.log.link.send(lambda: state.nak(self.seq, delay))

    async def term(self) -> None:
        state = self.durable.state
        self.durable.log.link.send(lambda: state.term(self.seq))

    async def in_progress(self) -> None:
        state = self.durable.state
        self.durable.log.link.send(lambda: state.in_progress(self.seq))


class MemoryDurable:
    """A bound durable pull consumer of a memory server."""

    def __init__(self, log: MemoryLog, state: DurableState) -> None:
        self.log = log
        self.state = state

    async def fetch(self, wait: float) -> list[Message]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        state = self.state
        if state.gone:
            raise ConsumerGone(f"consumer {state.name} was deleted")
        try:
            # Expiring before the client stops waiting, as nats-py asks: a message handed out
            # in between would be lost to the ack wait.
            fut = await self.log.link.call(lambda: state.pull(self.log, max(0.0, wait - PULL_MARGIN)), wait)
        except TimeoutError:
            return []
        try:
            async with asyncio.timeout(max(0.0, deadline - loop.time())):
                seq, delivered = await asyncio.shield(fut)
        except TimeoutError:
            state.cancel(fut)
            return []  # handed out as we gave up: lost, so it goes again after the ack wait
        if (seq, delivered) == GONE:
            raise ConsumerGone(f"consumer {state.name} was deleted")
        if not await self.log.link.arrive():
            return []  # lost on the way: delivered again after the ack wait
        m = state.stream.get(seq)
        if m is None:
            return []
        return [MemoryMessage(self, m.subject, m.data, seq, delivered)]

    async def exists(self) -> bool:
        key = (self.state.stream.name, self.state.name)
        return await self.log.ask(
            lambda: self.log.server.durables.get(key) is self.state and not self.state.gone,
            API_TIMEOUT,
            f"consumer info of {self.state.name}",
        )

    async def close(self) -> None:
        self.state.forget_client(self.log)


class MemoryKV:
    """One KV bucket of a memory server."""

    def __init__(self, log: MemoryLog, bucket: str) -> None:
        self.log, self.bucket = log, bucket

    async def create(self, key: str, value: bytes) -> int:
        return await self.log.ask(
            lambda: self.log.server.kv_write(self.bucket, key, value, last=None, create=True),
            API_TIMEOUT,
            f"create {self.bucket}/{key}",
        )

    async def update(self, key: str, value: bytes, last: int) -> int:
        return await self.log.ask(
            lambda: self.log.server.kv_write(self.bucket, key, value, last=last),
            API_TIMEOUT,
            f"update {self.bucket}/{key}",
        )

    async def put(self, key: str, value: bytes) -> int:
        return await self.log.ask(
            lambda: self.log.server.kv_write(self.bucket, key, value, last=None),
            API_TIMEOUT,
            f"put {self.bucket}/{key}",
        )

    async def get(self, key: str) -> KVEntry | None:
        return await self.log.ask(
            lambda: self.log.server.kv_get(self.bucket, key), API_TIMEOUT, f"get {self.bucket}/{key}"
        )

    async def delete(self, key: str, last: int | None = None) -> None:
        await self.log.ask(
            lambda: self.log.server.kv_delete(self.bucket, key, last),
            API_TIMEOUT,
            f"delete {self.bucket}/{key}",
        )
