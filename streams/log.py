"""The log as Motor's components speak to it: one interface, two implementations.

`JetStreamLog` (`streams.jetstream`) is production's: nats-py and the modules that grew around
it (`publisher`, `batch`, `consumer`, `reader`). `MemoryLog` (`streams.memory`) keeps the same
log in one process, for the seeded simulator (tests/sim), where every component runs on one
event loop under a simulated clock and network. The contract test
(tests/integration/test_log_contract.py) runs one set of cases against both, so the memory
log cannot drift from what JetStream does in the ways Motor relies on:

- **append**: a stream sequence per message, one total order; `Nats-Msg-Id` drops a copy
  inside the dedupe window (the original's sequence is returned); a guard
  (`Nats-Expected-Last-Subject-Sequence`, of another subject with `...-Subject`: a fence)
  refuses a message once that subject has moved (`SequenceConflict`); a batch lands all of it,
  in order and contiguously, or none (`streams.batch`).
- **read and follow**: an ordered consumer hands out every message of a range once, in order,
  with what is pending after it; it notices a connection that went away, waits and resumes
  after the last message it handed out; a missing stream is `StreamMissing`, one created again
  since reading began `StreamReplaced`.
- **last message per subject** (heartbeats: MOTOR_HB keeps one per node) and **age-out**.
- **KV** (the leader lease, checkpoints): revisions are stream sequences, `create` wins only a
  key that is free (never written, deleted, or aged out by the bucket's TTL), `update` only at
  the revision last written.
- **durable consumer** (a node's commands): one message out at a time until it is acked,
  redelivered after the ack wait or a nak's delay, never again after a term; the consumer
  outlives its client and is gone with its stream.

Only the interface lives here, and the types both sides share; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol

from core.config import NatsConfig
from core.events import EventBase
from streams.errors import StreamsError

if TYPE_CHECKING:
    from streams.lostlog import StreamView

API_TIMEOUT = 5.0  # how long a question to the log waits for its answer


class Delivery(NamedTuple):
    """One stream message as delivered: its sequence, time, subject and raw body."""

    seq: int
    pending: int  # matching messages left in the stream after this one, at delivery time
    ts_ns: int  # stream timestamp, nanoseconds since the epoch
    subject: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Range:
    """Which part of a stream to read: from a sequence or a time (else the first message), up to
    a sequence or a time (else the last message when reading began), on a subject filter."""

    start_seq: int | None = None
    start_time: float | None = None
    until_seq: int | None = None
    until_time: float | None = None
    filter_subject: str | None = None


EVERYTHING = Range()


class StreamMissing(StreamsError):
    """The stream to read does not exist."""


class StreamReplaced(StreamsError):
    """The stream was deleted and created again: its sequences are not the ones read so far."""


class WrongRevision(StreamsError):
    """A KV write expected another revision than the key has (someone else wrote it)."""


class BucketMissing(StreamsError):
    """The KV bucket does not exist (run ensure_streams)."""


@dataclass(frozen=True, slots=True)
class KVEntry:
    """A key's value and its revision (the sequence of the write in the bucket's stream)."""

    value: bytes
    revision: int


class Appends(Protocol):
    """Appending events (`streams.publisher.Publisher` is the JetStream one)."""

    async def publish(
        self,
        event: EventBase,
        *,
        expected_last_subject_seq: int | None = None,
        expected_subject: str | None = None,
    ) -> int:
        """Publish and wait for the ack; the stream sequence (the original's on a duplicate)."""
        ...

    async def publish_batch(
        self,
        events: Sequence[EventBase],
        *,
        expected_last_subject_seq: int | None = None,
        expected_subject: str | None = None,
        go_on: Callable[[], bool] | None = None,
    ) -> list[int | StreamsError]:
        """Publish in order, all or nothing a chunk at a time; every outcome in order (may end early)."""
        ...


class Ordered(Protocol):
    """An ordered consumer of one stream (`streams.consumer.PushConsumer` is the JetStream one)."""

    on_start: Callable[[int], None] | None  # after every (re)start, with the pending count
    last_seq: int  # stream sequence of the last message handed out
    resets: int  # recreations (outage, gap, lost heartbeats)
    delivering: bool  # a consumer exists and delivers (False while it is recreated)

    async def start(self) -> int:
        """Create the consumer; how many matching messages it has pending."""
        ...

    async def next_batch(self) -> list[Delivery]:
        """The next messages in stream order (at least one), or [] once closed."""
        ...

    async def close(self) -> None:
        """Stop delivery; a waiting `next_batch()` returns []."""
        ...


class Message(Protocol):
    """One delivery of a durable consumer's message."""

    subject: str
    data: bytes
    seq: int  # stream sequence
    delivered: int  # how many times it has been delivered, this one included

    async def ack(self, within: float) -> None:
        """Ack and wait for the server to confirm it; StreamsError or TimeoutError if unconfirmed."""
        ...

    async def nak(self, delay: float | None = None) -> None:
        """Deliver it again (after `delay` seconds)."""
        ...

    async def term(self) -> None:
        """Never deliver it again."""
        ...

    async def in_progress(self) -> None:
        """Still working on it: the ack wait starts over."""
        ...


class Durable(Protocol):
    """A durable pull consumer bound by one client."""

    async def fetch(self, wait: float) -> list[Message]:
        """The next message ([] when none came within `wait`); StreamsError when the fetch failed."""
        ...

    async def exists(self) -> bool:
        """Whether the consumer still exists on the server; StreamsError when it did not answer."""
        ...

    async def close(self) -> None:
        """Stop pulling (the consumer stays on the server)."""
        ...


class KV(Protocol):
    """One KV bucket."""

    async def create(self, key: str, value: bytes) -> int:
        """Write a key that is free; its revision. WrongRevision when it holds a value."""
        ...

    async def update(self, key: str, value: bytes, last: int) -> int:
        """Write a key whose revision is `last`; its new revision. WrongRevision otherwise."""
        ...

    async def put(self, key: str, value: bytes) -> int:
        """Write a key whatever it holds; its revision."""
        ...

    async def get(self, key: str) -> KVEntry | None:
        """The key's value, or None when it has none (never written, deleted, aged out)."""
        ...

    async def delete(self, key: str, last: int | None = None) -> None:
        """Delete the key (only at revision `last` when given)."""
        ...


class Log(Protocol):
    """Everything a Motor component needs of the log."""

    @property
    def connected(self) -> bool:
        """Connected to the server (requests now are not merely queued)."""
        ...

    @property
    def reconnects(self) -> int:
        """Times the connection was made again (after one a server may have restarted, and
        taken every ordered consumer with it)."""
        ...

    async def answers(self, within: float) -> bool:
        """Whether the server answers a question within `within` seconds."""
        ...

    async def ensure_streams(
        self, cfg: NatsConfig | None = None, *, lease_ttl: float, update: bool = True
    ) -> None:
        """Create Motor's streams and buckets (`streams.definitions`), or update changed ones."""
        ...

    async def stream_info(self, stream: str, *, wait: float = API_TIMEOUT) -> StreamView:
        """The stream's bounds, creation time and the server's clock; StreamMissing when absent."""
        ...

    async def last_subject_seq(self, stream: str, subject: str) -> int:
        """Sequence of the last message on `subject` (0: none)."""
        ...

    async def message(self, stream: str, seq: int) -> Delivery | None:
        """The message the stream holds at `seq` (None: none there); its `pending` is 0."""
        ...

    def publisher(self, *, ack_timeout: float = 5.0) -> Appends:
        """An appender of events, each publish waiting at most `ack_timeout` for its ack."""
        ...

    def ordered(
        self,
        stream: str,
        *,
        start_seq: int | None = None,
        start_time: float | None = None,
        filter_subject: str | None = None,
        idle_heartbeat: float = 2.0,
        expect_created: str | None = None,
    ) -> Ordered:
        """An ordered consumer (not started): from a sequence or a time, else the first message."""
        ...

    async def durable(
        self,
        stream: str,
        name: str,
        *,
        filter_subject: str,
        ack_wait: float,
        max_ack_pending: int = 1,
        start_time: float | None = None,
    ) -> Durable:
        """Bind the durable pull consumer `name`, creating it when missing: delivering what is
        published from now on, or from `start_time` when given."""
        ...

    def kv(self, bucket: str) -> KV:
        """One KV bucket."""
        ...

    def read(self, stream: str, span: Range) -> AsyncIterator[list[Delivery]]:
        """Raw messages of a range in batches; ends at what existed when called."""
        ...

    async def close(self) -> None:
        """Let go of the connection."""
        ...
