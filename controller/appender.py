"""Appending decisions: each guarded by its subject's last folded sequence.

A decision lands only if its entity's subject has not moved since the state it was decided
on; otherwise JetStream refuses it (`SequenceConflict`), the batch stops, and the controller
folds what the other writer wrote and decides again. Nothing here raises to the caller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from controller.decision import Decision
from controller.fold import Fold
from controller.metrics import ControllerMetrics
from streams.definitions import MOTOR_STREAM
from streams.errors import SequenceConflict, StreamsError
from streams.publisher import Publisher

log = logging.getLogger(__name__)


class Appender:
    def __init__(self, js: JetStreamContext, fold: Fold, metrics: ControllerMetrics) -> None:
        self.js = js
        self.fold = fold
        self.metrics = metrics
        self.publisher = Publisher(js)
        self.awaited = 0  # highest sequence appended: decide again only once it is folded

    async def expected(self, subject: str) -> int | None:
        """The subject's last sequence as folded; None when the stream is ahead of the fold."""
        seq = self.fold.subject_seq.get(subject)
        if seq is not None or self.fold.complete:
            return seq or 0
        try:
            msg = await self.js.get_last_msg(MOTOR_STREAM, subject)
            last = int(msg.seq or 0)
        except NotFoundError:
            last = 0
        if last > self.fold.state.last_seq:
            return None  # written after what we folded: fold it first
        self.fold.subject_seq[subject] = last
        return last

    async def append(self, decisions: Sequence[Decision], may_write: Callable[[], bool]) -> int:
        """Append in order until one fails; return how many landed (duplicates included)."""
        guard: dict[str, int] = {}
        done = 0
        for d in decisions:
            if not may_write():
                log.info("lease no longer valid: %d decision(s) not appended", len(decisions) - done)
                break
            subject = d.subject
            expected: int | None = guard[subject] if subject in guard else await self.expected(subject)
            if expected is None:
                break
            try:
                seq = await self.publisher.publish(d.event, expected_last_subject_seq=expected)
            except SequenceConflict as exc:
                self.metrics.conflicts.inc()
                log.info("someone else wrote first (%s); folding and deciding again", exc)
                break
            except StreamsError as exc:
                self.metrics.append_errors.inc()
                log.warning("append of %s failed: %s; retrying on the next tick", d.summary(), exc)
                break
            guard[subject] = seq
            self.awaited = max(self.awaited, seq)
            self.metrics.decisions.labels(d.event.type).inc()  # type: ignore[attr-defined]
            log.info("seq %d: %s", seq, d.summary())
            done += 1
        return done
