"""Poison events: what a fold skips, why, and how it is told.

An event is skipped when it cannot be decoded (`undecodable`: not JSON, not a valid event,
a non-finite `ts`), names a type this code does not know (`unknown_type`), carries a newer
`schema_version` than this code reads (`newer_schema`), sits on a subject other than the one
its data names (`wrong_subject`: NATS permissions guard subjects, so such an event is not
believed), or decodes but its apply callback raised (`inapplicable`). A skipped event never stops a fold: a new producer, a rogue client
or a reducer bug must cost one event, not the reader.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass

from core.errors import DecodeError, NewerSchema, UnknownEventType, WrongSubject

log = logging.getLogger(__name__)

UNDECODABLE = "undecodable"
UNKNOWN_TYPE = "unknown_type"
NEWER_SCHEMA = "newer_schema"
WRONG_SUBJECT = "wrong_subject"
INAPPLICABLE = "inapplicable"
REASONS = (UNDECODABLE, UNKNOWN_TYPE, NEWER_SCHEMA, WRONG_SUBJECT, INAPPLICABLE)

# Each skipped event is logged once; past this many of one reason only every LOG_EVERY-th is,
# so a flood of garbage from one client cannot flood the log file too.
LOG_FIRST = 100
LOG_EVERY = 1000


def reason_for(exc: DecodeError) -> str:
    """A short name for why an event could not be decoded."""
    if isinstance(exc, UnknownEventType):
        return UNKNOWN_TYPE
    if isinstance(exc, NewerSchema):
        return NEWER_SCHEMA
    if isinstance(exc, WrongSubject):
        return WRONG_SUBJECT
    return UNDECODABLE


@dataclass(frozen=True, slots=True)
class Skipped:
    """One event a fold skipped: where it sits in the log and why."""

    stream: str
    seq: int
    subject: str
    reason: str
    detail: str

    def render(self) -> str:
        """`MOTOR seq 42 (motor.evt.refresh.coordinator) skipped, inapplicable: KeyError 'id'`."""
        return f"{self.stream} seq {self.seq} ({self.subject}) skipped, {self.reason}: {self.detail}"


class SkipLog:
    """Counts skipped events by reason, logs each once, keeps the latest for display."""

    def __init__(
        self, *, on_skip: Callable[[Skipped], None] | None = None, keep: int = 50, quiet: bool = False
    ) -> None:
        self.on_skip = on_skip
        self.quiet = quiet  # a CLI shows `recent` itself
        self.by_reason: collections.Counter[str] = collections.Counter()
        self.recent: collections.deque[Skipped] = collections.deque(maxlen=keep)

    @property
    def total(self) -> int:
        return sum(self.by_reason.values())

    def note(self, stream: str, seq: int, subject: str, reason: str, detail: str) -> Skipped:
        """Record one skipped event."""
        skipped = Skipped(stream, seq, subject, reason, detail)
        self.by_reason[reason] += 1
        self.recent.append(skipped)
        n = self.by_reason[reason]
        if not self.quiet and (n <= LOG_FIRST or n % LOG_EVERY == 0):
            more = f" ({n} {reason} so far)" if n > LOG_FIRST else ""
            log.warning("%s%s", skipped.render(), more)
        if self.on_skip is not None:
            self.on_skip(skipped)
        return skipped

    def decode_error(self, stream: str, seq: int, subject: str, exc: DecodeError) -> Skipped:
        """Record an event the codec refused."""
        return self.note(stream, seq, subject, reason_for(exc), str(exc))

    def apply_error(self, stream: str, seq: int, subject: str, exc: BaseException) -> Skipped:
        """Record an event whose apply callback raised."""
        return self.note(stream, seq, subject, INAPPLICABLE, f"{type(exc).__name__}: {exc}")
