"""One stream kept in memory, with JetStream's rules for what lands and what stays.

A message gets the next stream sequence; `Nats-Expected-Last-Subject-Sequence` (of another
subject with `...-Subject`) refuses it with 10071 once that subject's last sequence differs,
checked before the duplicate window as JetStream does (so a decision sent again after its
fence moved is refused, not answered as a duplicate); `Nats-Msg-Id` inside the duplicate
window answers with the original's sequence; an atomic batch is checked whole, message by
message, before any of it is stored. Limits: the last
`max_msgs_per_subject` messages of a subject stay, and messages older than `max_age` age out
(checked whenever the stream is touched, which is when anyone could tell). The stream's
settings are the `nats.js.api.StreamConfig` objects `streams.definitions` builds for
JetStream, so both logs run on one description.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from nats.js.api import StreamConfig

from streams.batch import ATOMIC_DISABLED, ATOMIC_LIMIT, BATCH_TOO_LARGE, DUPLICATE_IN_BATCH
from streams.errors import StreamsError
from streams.lostlog import StreamView
from streams.publisher import (
    EXPECTED_LAST_SUBJECT_SEQ,
    EXPECTED_LAST_SUBJECT_SEQ_SUBJECT,
    MSG_ID,
    WRONG_LAST_SEQUENCE,
)

KV_OPERATION = "KV-Operation"  # a KV delete (or purge) marker says so in this header
NO_STREAM = 10077  # not JetStream's code (it answers "no responders"): how the memory log says it

Headers = dict[str, str]


class Refused(StreamsError):
    """The stream refused a message (or a batch): JetStream's error code and description."""

    def __init__(self, code: int, description: str) -> None:
        super().__init__(description)
        self.code = code
        self.description = description


@functools.lru_cache(maxsize=4096)
def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, a final `>` one or more."""
    pt, st = pattern.split("."), subject.split(".")
    for i, p in enumerate(pt):
        if p == ">":
            return len(st) > i
        if i >= len(st) or (p != "*" and p != st[i]):
            return False
    return len(pt) == len(st)


@dataclass(frozen=True, slots=True)
class Stored:
    """One message as the stream holds it."""

    seq: int
    subject: str
    data: bytes
    ts: float  # server clock when stored
    msg_id: str | None
    marker: bool = False  # a KV delete or purge marker


class MemStream:
    """One incarnation of a stream: deleting it and creating it again makes another."""

    def __init__(self, config: StreamConfig, created: str) -> None:
        assert config.name is not None
        self.name = config.name
        self.created = created
        self.configure(config)
        self.last_seq = 0
        self.deleted = False
        self._seqs: list[int] = []  # live sequences, ascending
        self._msgs: dict[int, Stored] = {}
        self._by_subject: dict[str, collections.deque[int]] = {}
        self._dedupe: collections.OrderedDict[str, tuple[int, float]] = collections.OrderedDict()
        # Woken when a message lands or the stream goes; a dict, so they wake in the order they
        # began to listen (a set would wake them in memory order, and runs would not repeat).
        self.listeners: dict[asyncio.Event, None] = {}

    def configure(self, config: StreamConfig) -> None:
        """Apply (new) settings."""
        self.config = config
        self.subjects = tuple(config.subjects or ())
        self.max_age = float(config.max_age or 0.0)
        self.per_subject = int(config.max_msgs_per_subject or -1)
        self.window = float(config.duplicate_window or 120.0)
        self.allow_atomic = bool(config.allow_atomic)

    def takes(self, subject: str) -> bool:
        return any(subject_matches(p, subject) for p in self.subjects)

    # ------------------------------------------------------------------ reading

    @property
    def first_seq(self) -> int:
        if self._seqs:
            return self._seqs[0]
        return self.last_seq + 1 if self.last_seq else 0

    def view(self, now: float) -> StreamView:
        """What STREAM.INFO says now."""
        self.expire(now)
        first = self._msgs[self._seqs[0]] if self._seqs else None
        last = self._msgs[self._seqs[-1]] if self._seqs else None
        return StreamView(
            created=self.created,
            first_seq=self.first_seq,
            last_seq=self.last_seq,
            messages=len(self._seqs),
            first_ts=first.ts if first else None,
            last_ts=last.ts if last else None,
            now=now,
            max_age=self.max_age,
        )

    def last_on(self, subject: str) -> int:
        """Sequence of the subject's last message still held (0: none)."""
        seqs = self._by_subject.get(subject)
        return seqs[-1] if seqs else 0

    def last_message(self, subject: str) -> Stored | None:
        seq = self.last_on(subject)
        return self._msgs[seq] if seq else None

    def after(self, seq: int, filt: str | None) -> Iterator[Stored]:
        """Messages past `seq`, on `filt` when given, in order."""
        seqs, msgs = self._seqs, self._msgs
        for i in range(bisect.bisect_right(seqs, seq), len(seqs)):
            m = msgs[seqs[i]]
            if filt is None or subject_matches(filt, m.subject):
                yield m

    def count_after(self, seq: int, filt: str | None) -> int:
        if filt is None:
            return len(self._seqs) - bisect.bisect_right(self._seqs, seq)
        return sum(1 for _ in self.after(seq, filt))

    def first_at_or_after(self, ts: float) -> int:
        """Sequence of the first message stored at or after `ts` (last + 1: none)."""
        for s in self._seqs:
            if self._msgs[s].ts >= ts:
                return s
        return self.last_seq + 1

    def get(self, seq: int) -> Stored | None:
        return self._msgs.get(seq)

    # ------------------------------------------------------------------ writing

    def publish(self, subject: str, data: bytes, hdr: Headers, now: float) -> tuple[int, bool]:
        """Store one message; (its sequence, whether it was a duplicate). Raises Refused."""
        self.expire(now)
        self._prune_dedupe(now)
        self._guard(subject, hdr, {})
        mid = hdr.get(MSG_ID)
        if mid is not None and mid in self._dedupe:
            return self._dedupe[mid][0], True
        return self._append(subject, data, now, mid, hdr.get(KV_OPERATION) is not None), False

    def publish_batch(self, items: Sequence[tuple[str, bytes, Headers]], now: float) -> tuple[int, ...]:
        """Store all of `items` contiguously, or none of them (Refused says why)."""
        if not self.allow_atomic:
            raise Refused(ATOMIC_DISABLED, "atomic publish is disabled")
        if len(items) > ATOMIC_LIMIT:
            raise Refused(BATCH_TOO_LARGE, "atomic publish batch is too large")
        self.expire(now)
        self._prune_dedupe(now)
        ids: set[str] = set()
        staged: dict[str, int] = {}
        for i, (subject, _, hdr) in enumerate(items):
            # Message by message, the id before the guard: the other way round from a single
            # message (both pinned by tests/integration/test_log_contract.py).
            mid = hdr.get(MSG_ID)
            if mid is not None:
                if mid in ids or mid in self._dedupe:
                    raise Refused(DUPLICATE_IN_BATCH, "atomic publish batch contains duplicate message id")
                ids.add(mid)
            self._guard(subject, hdr, staged)
            staged[subject] = self.last_seq + 1 + i
        return tuple(self._append(s, d, now, h.get(MSG_ID), False) for s, d, h in items)

    def _guard(self, subject: str, hdr: Headers, staged: dict[str, int]) -> None:
        expected = hdr.get(EXPECTED_LAST_SUBJECT_SEQ)
        if expected is None:
            return
        guard = hdr.get(EXPECTED_LAST_SUBJECT_SEQ_SUBJECT) or subject
        last = staged.get(guard, self.last_on(guard))
        if last != int(expected):
            raise Refused(WRONG_LAST_SEQUENCE, f"wrong last sequence: {last}")

    def _append(self, subject: str, data: bytes, now: float, mid: str | None, marker: bool) -> int:
        self.last_seq += 1
        seq = self.last_seq
        self._msgs[seq] = Stored(seq, subject, data, now, mid, marker)
        self._seqs.append(seq)
        held = self._by_subject.setdefault(subject, collections.deque())
        held.append(seq)
        if self.per_subject > 0:
            while len(held) > self.per_subject:
                self._forget(held[0])
        if mid is not None:
            self._dedupe[mid] = (seq, now)
        self._wake()
        return seq

    # ------------------------------------------------------------------ removal

    def expire(self, now: float) -> None:
        """Age out what is older than `max_age`."""
        if self.max_age <= 0:
            return
        cutoff = now - self.max_age
        while self._seqs and self._msgs[self._seqs[0]].ts <= cutoff:
            self._forget(self._seqs[0])

    def _prune_dedupe(self, now: float) -> None:
        d = self._dedupe
        while d:
            _, (_, ts) = next(iter(d.items()))
            if now - ts < self.window:
                break
            d.popitem(last=False)

    def _forget(self, seq: int) -> None:
        m = self._msgs.pop(seq)
        i = bisect.bisect_left(self._seqs, seq)
        del self._seqs[i]
        held = self._by_subject[m.subject]
        held.remove(seq)
        if not held:
            del self._by_subject[m.subject]

    def purge(self) -> int:
        """Remove every message; sequences go on and the duplicate window stays (as JetStream's)."""
        n = len(self._seqs)
        self._seqs.clear()
        self._msgs.clear()
        self._by_subject.clear()
        self._wake()
        return n

    def rewind(self, count: int) -> list[int]:
        """Lose the last `count` messages (a store that lost its tail): later messages take
        their sequences again, and their ids are not remembered. The sequences lost."""
        lost = self._seqs[-count:] if count > 0 else []
        floor = self.first_seq - 1
        for seq in lost:
            mid = self._msgs[seq].msg_id
            if mid is not None:
                self._dedupe.pop(mid, None)
            self._forget(seq)
        if lost:
            self.last_seq = self._seqs[-1] if self._seqs else max(0, min(lost) - 1, floor)
        self._wake()
        return lost

    def drop(self) -> None:
        """Deleted: readers find out."""
        self.deleted = True
        self._wake()

    def _wake(self) -> None:
        for ev in list(self.listeners):
            ev.set()
