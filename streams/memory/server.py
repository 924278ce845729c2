"""The memory log's server: Motor's streams and buckets, durable consumers, and the faults a
JetStream server can suffer (purge, delete and create again, a lost tail, garbage appended).

Every operation here is synchronous and runs "at the server": clients reach it through a
`streams.memory.link.Link`, which decides how long the trip takes and whether it arrives. The
clock is the server's (message timestamps, age-out, STREAM.INFO's `ts`); timers (ack waits)
run in the server's own context, so a client that froze or died never holds them up.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from nats.js.api import StreamConfig

from core.config import NatsConfig
from streams.definitions import LEASE_TTL, kv_stream, stream_configs
from streams.log import BucketMissing, KVEntry, StreamMissing, WrongRevision
from streams.lostlog import StreamView
from streams.memory.durables import ConsumerGone, DurableState
from streams.memory.store import KV_OPERATION, NO_STREAM, Headers, MemStream, Refused
from streams.publisher import EXPECTED_LAST_SUBJECT_SEQ, WRONG_LAST_SEQUENCE


class MemoryServer:
    """Streams by name and the durable consumers on them."""

    def __init__(
        self, *, clock: Callable[[], float] = time.time, context: contextvars.Context | None = None
    ) -> None:
        self.clock = clock
        self.context = context  # where timers run (None: whoever set them)
        self.streams: dict[str, MemStream] = {}
        self.durables: dict[tuple[str, str], DurableState] = {}
        self._incarnations = 0
        self.epoch = 0  # restarts of the server process: ordered consumers do not survive one

    # ------------------------------------------------------------------ streams

    def ensure_streams(
        self, cfg: NatsConfig | None = None, *, lease_ttl: float = LEASE_TTL, update: bool = True
    ) -> None:
        """`streams.definitions.ensure_streams` on this server: the same settings, as data."""
        for want in stream_configs(cfg, lease_ttl=lease_ttl):
            self.add_stream(want, update=update)

    def add_stream(self, config: StreamConfig, *, update: bool = True) -> MemStream:
        assert config.name is not None
        have = self.streams.get(config.name)
        if have is None:
            self._incarnations += 1
            have = self.streams[config.name] = MemStream(config, self._created())
        elif update:
            have.configure(config)
        return have

    def _created(self) -> str:
        # RFC 3339 like JetStream's, unique per incarnation even within one microsecond.
        t = datetime.fromtimestamp(self.clock(), UTC)
        return f"{t:%Y-%m-%dT%H:%M:%S}.{t.microsecond:06d}{self._incarnations % 1000:03d}Z"

    def stream(self, name: str) -> MemStream:
        s = self.streams.get(name)
        if s is None:
            raise StreamMissing(f"stream {name} not found (run ensure_streams)")
        return s

    def for_subject(self, subject: str) -> MemStream:
        for s in self.streams.values():
            if s.takes(subject):
                return s
        raise Refused(NO_STREAM, f"{subject}: no stream takes this subject (run ensure_streams)")

    def view(self, name: str) -> StreamView:
        return self.stream(name).view(self.clock())

    def last_subject_seq(self, name: str, subject: str) -> int:
        s = self.stream(name)
        s.expire(self.clock())
        return s.last_on(subject)

    # ------------------------------------------------------------------ appending

    def publish(self, subject: str, data: bytes, hdr: Headers) -> tuple[str, int, bool]:
        """(stream, sequence, duplicate) of one message; raises Refused."""
        s = self.for_subject(subject)
        seq, dup = s.publish(subject, data, hdr, self.clock())
        if not dup:
            self._landed(s)
        return s.name, seq, dup

    def publish_batch(self, items: Sequence[tuple[str, bytes, Headers]]) -> tuple[str, tuple[int, ...]]:
        """(stream, sequences) of an atomic batch, all of it stored or none; raises Refused."""
        streams = {self.for_subject(subject).name for subject, _, _ in items}
        if len(streams) != 1:
            raise Refused(10_000, "an atomic batch must go to one stream")
        s = self.stream(streams.pop())
        seqs = s.publish_batch(items, self.clock())
        self._landed(s)
        return s.name, seqs

    def _landed(self, s: MemStream) -> None:
        for (name, _), d in list(self.durables.items()):
            if name == s.name:
                d.dispatch()

    # ------------------------------------------------------------------ KV

    def _kv(self, bucket: str, key: str) -> tuple[MemStream, str]:
        s = self.streams.get(kv_stream(bucket))
        if s is None:
            raise BucketMissing(f"KV bucket {bucket} missing (run ensure_streams)")
        s.expire(self.clock())
        return s, f"$KV.{bucket}.{key}"

    def kv_get(self, bucket: str, key: str) -> KVEntry | None:
        s, subject = self._kv(bucket, key)
        m = s.last_message(subject)
        if m is None or m.marker:
            return None
        return KVEntry(m.data, m.seq)

    def kv_write(self, bucket: str, key: str, value: bytes, *, last: int | None, create: bool = False) -> int:
        """Write at revision `last` (None: whatever it holds); `create`: only a free key."""
        s, subject = self._kv(bucket, key)
        held = s.last_message(subject)
        if create:
            if held is not None and not held.marker:
                raise WrongRevision(f"{bucket}/{key} holds a value")
            last = held.seq if held is not None else 0
        hdr: Headers = {}
        if last is not None:
            hdr[EXPECTED_LAST_SUBJECT_SEQ] = str(last)
        return self._kv_publish(s, subject, value, hdr, bucket, key, last)

    def kv_delete(self, bucket: str, key: str, last: int | None) -> None:
        s, subject = self._kv(bucket, key)
        hdr: Headers = {KV_OPERATION: "DEL"}
        if last:
            hdr[EXPECTED_LAST_SUBJECT_SEQ] = str(last)
        self._kv_publish(s, subject, b"", hdr, bucket, key, last)

    def _kv_publish(
        self, s: MemStream, subject: str, value: bytes, hdr: Headers, bucket: str, key: str, last: int | None
    ) -> int:
        try:
            seq, _ = s.publish(subject, value, hdr, self.clock())
        except Refused as exc:
            if exc.code == WRONG_LAST_SEQUENCE:
                raise WrongRevision(f"{bucket}/{key} is not at revision {last}") from None
            raise
        return seq

    # ------------------------------------------------------------------ durable consumers

    def bind_durable(
        self,
        stream: str,
        name: str,
        *,
        filter_subject: str,
        ack_wait: float,
        max_ack_pending: int,
        start_time: float | None,
    ) -> DurableState:
        """The durable consumer `name`, created when missing (an existing one keeps its settings)."""
        s = self.stream(stream)
        d = self.durables.get((stream, name))
        if d is not None and not d.gone:
            return d
        start = s.last_seq + 1 if start_time is None else s.first_at_or_after(start_time)
        d = DurableState(
            s,
            name,
            filter_subject=filter_subject,
            ack_wait=ack_wait,
            max_ack_pending=max_ack_pending,
            start_seq=start,
            context=self.context,
        )
        self.durables[(stream, name)] = d
        return d

    def durable(self, stream: str, name: str) -> DurableState:
        d = self.durables.get((stream, name))
        if d is None or d.gone:
            raise ConsumerGone(f"consumer {name} on {stream} not found")
        return d

    def forget_client(self, client: object) -> None:
        """A client's connection is gone: its waiting pull requests go with it."""
        for d in self.durables.values():
            d.forget_client(client)

    # ------------------------------------------------------------------ faults

    def purge(self, name: str) -> int:
        """Remove every message of a stream (sequences go on); how many were removed."""
        n = self.stream(name).purge()
        for (sname, _), d in self.durables.items():
            if sname == name:
                d.dispatch()
        return n

    def delete_stream(self, name: str) -> None:
        """Delete a stream and its consumers."""
        s = self.streams.pop(name, None)
        if s is None:
            return
        s.drop()
        for key in [k for k in self.durables if k[0] == name]:
            self.durables.pop(key).drop()

    def recreate(self, name: str) -> None:
        """Delete a stream and create it again, empty, with the same settings."""
        config = self.stream(name).config
        self.delete_stream(name)
        self.add_stream(config)

    def rewind(self, name: str, count: int) -> list[int]:
        """The stream loses its last `count` messages (its store lost its tail)."""
        s = self.stream(name)
        lost = s.rewind(count)
        for (sname, _), d in self.durables.items():
            if sname == name:
                d.clamp()
        return lost

    def restart(self) -> None:
        """The server process restarts: streams and durable consumers are kept (file storage),
        ordered consumers are not (memory storage): their clients find out when heartbeats stop."""
        self.epoch += 1

    def inject(self, subject: str, data: bytes) -> int:
        """Append raw bytes, no headers: what a rogue or broken client can do."""
        return self.publish(subject, data, {})[1]
