"""Replay-then-follow over one ordered push consumer, for the tests (`Follower`): services that
fold the log for as long as they run use `streams.livefold.LiveFold`, which adds outage,
lost-log and poison handling on top of the same consumer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from nats.aio.client import Client

from core.codec import decode
from core.errors import DecodeError
from streams.consumer import PushConsumer
from streams.definitions import MOTOR_STREAM
from streams.reader import Record, SkipCounter


class Follower:
    """Replays a stream from `start_seq` and then follows it live: no gap, no duplicate.

    `caught_up` is set the first time nothing is pending; it is a moment, not an end
    state, so iteration simply continues with live events.
    """

    def __init__(
        self,
        nc: Client,
        stream: str = MOTOR_STREAM,
        *,
        start_seq: int | None = None,
        filter_subject: str | None = None,
        raw: bool | None = None,
        idle_heartbeat: float = 2.0,
    ) -> None:
        self.stream = stream
        self.caught_up = asyncio.Event()
        self._consumer = PushConsumer(
            nc,
            stream,
            start_seq=start_seq,
            filter_subject=filter_subject,
            raw=raw,
            idle_heartbeat=idle_heartbeat,
        )
        self._skips = SkipCounter(stream)
        self._started = False

    @property
    def skipped(self) -> int:
        """Events skipped because they could not be decoded (unknown type, newer schema, bad)."""
        return self._skips.total

    @property
    def skip_reasons(self) -> dict[str, int]:
        return dict(self._skips.by_reason)

    @property
    def transport(self) -> str:
        """How messages arrive: "raw" (own protocol connection) or "nats-py"."""
        return self._consumer.transport

    @property
    def resets(self) -> int:
        """How many times the consumer was recreated (gap, lost heartbeats, reconnect)."""
        return self._consumer.resets

    @property
    def last_seq(self) -> int:
        """Stream sequence of the last message read (decoded or skipped)."""
        return self._consumer.last_seq

    async def start(self) -> None:
        """Create the consumer (done by the first iteration if not called)."""
        if not self._started:
            self._started = True
            if await self._consumer.start() == 0:
                self.caught_up.set()

    def __aiter__(self) -> AsyncIterator[Record]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Record]:
        await self.start()
        consumer = self._consumer
        caught_up = self.caught_up
        stream = self.stream
        while batch := await consumer.next_batch():
            for d in batch:
                try:
                    ev = decode(d.data, d.subject)
                except DecodeError as exc:
                    self._skips.skip(d, exc)
                else:
                    yield Record(stream, d.seq, d.subject, ev, d.ts_ns / 1e9)
                # Set only once the caller has taken the record: "caught up" then means its
                # fold already holds everything that was in the stream.
                if d.pending == 0 and not caught_up.is_set():
                    caught_up.set()

    async def close(self) -> None:
        """Stop following and delete the consumer."""
        await self._consumer.close()
