"""A durable pull consumer kept by the memory server: what JetStream keeps for one.

Messages on the filter go out in stream order to pull requests, at most `max_ack_pending`
unacknowledged at a time. An unacked message goes out again once its ack wait has passed (an
`in_progress` starts the wait over) or a nak's delay has; an acked or termed one never does.
The consumer lives on the server: a client that dies leaves its unacked message to the ack
wait, and the next client to bind the same name carries on from there. It is gone with its
stream (delete, or delete and create again).
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
from dataclasses import dataclass, field

from streams.errors import StreamsError
from streams.memory.store import MemStream, subject_matches


class ConsumerGone(StreamsError):
    """The durable consumer no longer exists (its stream was deleted)."""


GONE = (0, 0)  # what a pull request gets when its consumer is deleted under it


@dataclass(slots=True)
class Outstanding:
    """A message delivered and not yet acked, nor termed."""

    delivered: int
    timer: asyncio.TimerHandle | None = None


@dataclass(slots=True)
class Pull:
    """One client's pull request, waiting for a message until it expires (as nats-py's fetch
    asks: a request that arrives late must not take a message nobody waits for)."""

    client: object
    expires: float  # loop time
    fut: asyncio.Future[tuple[int, int]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class DurableState:
    """Server-side state of one durable consumer."""

    def __init__(
        self,
        stream: MemStream,
        name: str,
        *,
        filter_subject: str,
        ack_wait: float,
        max_ack_pending: int,
        start_seq: int,
        context: contextvars.Context | None,
    ) -> None:
        self.stream = stream
        self.name = name
        self.filter = filter_subject
        self.ack_wait = ack_wait
        self.max_ack_pending = max_ack_pending
        self.next_seq = start_seq  # the next message never delivered is at or after this
        self.outstanding: dict[int, Outstanding] = {}
        self.due: list[int] = []  # outstanding sequences to deliver again, ascending
        self.pulls: list[Pull] = []
        self.gone = False
        self._context = context  # timers run as the server's, never as a client's

    # ------------------------------------------------------------------ client side

    def pull(self, client: object, expires: float) -> asyncio.Future[tuple[int, int]]:
        """A pull request for one message, good for `expires` seconds: the future gets
        (sequence, times delivered)."""
        if self.gone:
            raise ConsumerGone(f"consumer {self.name} was deleted")
        p = Pull(client, asyncio.get_running_loop().time() + expires)
        self.pulls.append(p)
        self.dispatch()
        return p.fut

    def cancel(self, fut: asyncio.Future[tuple[int, int]]) -> None:
        """The client stopped waiting (its fetch timed out)."""
        self.pulls = [p for p in self.pulls if p.fut is not fut]

    def forget_client(self, client: object) -> None:
        """The client's connection is gone: its pull requests with it."""
        for p in self.pulls:
            if p.client is client and not p.fut.done():
                p.fut.cancel()
        self.pulls = [p for p in self.pulls if p.client is not client]

    def ack(self, seq: int) -> None:
        self._settle(seq)

    def term(self, seq: int) -> None:
        self._settle(seq)

    def nak(self, seq: int, delay: float | None) -> None:
        o = self.outstanding.get(seq)
        if o is None:
            return
        if o.timer is not None:
            o.timer.cancel()
        if delay:
            o.timer = self._later(delay, lambda: self._make_due(seq, o))
        else:
            o.timer = None
            self._make_due(seq, o)

    def in_progress(self, seq: int) -> None:
        o = self.outstanding.get(seq)
        if o is None or seq in self.due:
            return
        if o.timer is not None:
            o.timer.cancel()
        o.timer = self._later(self.ack_wait, lambda: self._make_due(seq, o))

    # ------------------------------------------------------------------ server side

    def dispatch(self) -> None:
        """Hand out what can go out to the waiting pull requests."""
        while self.pulls and not self.gone:
            seq = self._next()
            if seq is None:
                return
            p = self.pulls.pop(0)
            if p.fut.done() or p.expires <= asyncio.get_running_loop().time():
                continue  # nobody waits for it any more
            o = self.outstanding.get(seq)
            if o is None:
                o = self.outstanding[seq] = Outstanding(0)
                self.next_seq = seq + 1
            else:
                self.due.remove(seq)
            o.delivered += 1
            o.timer = self._later(self.ack_wait, lambda s=seq, oo=o: self._make_due(s, oo))
            p.fut.set_result((seq, o.delivered))

    def _next(self) -> int | None:
        while self.due:
            seq = self.due[0]
            if self.stream.get(seq) is not None:
                return seq
            self._settle(seq)  # purged or lost meanwhile: nothing to deliver again
        if len(self.outstanding) >= self.max_ack_pending:
            return None
        for m in self.stream.after(self.next_seq - 1, None):
            if subject_matches(self.filter, m.subject):
                return m.seq
        return None

    def _make_due(self, seq: int, o: Outstanding) -> None:
        if self.outstanding.get(seq) is not o or seq in self.due:
            return
        o.timer = None
        bisect.insort(self.due, seq)
        self.dispatch()

    def _settle(self, seq: int) -> None:
        o = self.outstanding.pop(seq, None)
        if o is None:
            return
        if o.timer is not None:
            o.timer.cancel()
        if seq in self.due:
            self.due.remove(seq)
        self.dispatch()

    def _later(self, delay: float, cb: object) -> asyncio.TimerHandle:
        loop = asyncio.get_running_loop()
        return loop.call_later(delay, cb, context=self._context)  # type: ignore[arg-type]

    def clamp(self) -> None:
        """After the stream lost its tail: nothing beyond what it holds is owed."""
        last = self.stream.last_seq
        self.next_seq = min(self.next_seq, last + 1)
        for seq in [s for s in self.outstanding if s > last]:
            self._settle(seq)

    def drop(self) -> None:
        """Deleted (with its stream)."""
        self.gone = True
        for o in self.outstanding.values():
            if o.timer is not None:
                o.timer.cancel()
        for p in self.pulls:
            if not p.fut.done():
                p.fut.set_result(GONE)  # not an exception: its fetch may have stopped waiting
        self.pulls.clear()
