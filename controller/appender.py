"""Appending decisions, each fenced by the leader's own announcement.

A leader announces itself with `controller.leader_changed` on the leader subject, guarded
by that subject's last folded sequence (two controllers cannot both announce on the same
past). Every decision after that carries `Nats-Expected-Last-Subject-Sequence: <that seq>`
for `Nats-Expected-Last-Subject-Sequence-Subject: <leader subject>`: JetStream refuses it
(`Fenced`) once any other controller has announced itself, however late the write arrives
(a frozen process, a slow network). The fence replaces the per-entity subject guard: only
the leader writes decisions, and level-based deciding on its own folded appends
(`awaited`, derived ids) keeps it from repeating itself. A batch is one atomic batch: sent at once,
all of it or none of it landing. Nothing here raises to the caller.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Sequence

from controller.fold import Fold
from controller.metrics import ControllerMetrics
from controller.rule_context import Decision
from core import subjects
from streams.definitions import MOTOR_STREAM
from streams.errors import SequenceConflict, StoreFull, StreamsError
from streams.log import Log

log = logging.getLogger(__name__)

FULL_SAID_EVERY = 30.0  # seconds between warnings while MOTOR stays full (decide tries each tick)


class Outcome(enum.Enum):
    """How an append batch ended."""

    DONE = "done"  # every decision landed
    STOPPED = "stopped"  # an error or a lapsed lease stopped it; try again next tick
    FENCED = "fenced"  # another controller announced itself: this one is deposed


class Appender:
    def __init__(self, log: Log, fold: Fold, metrics: ControllerMetrics) -> None:
        self.log = log
        self.fold = fold
        self.metrics = metrics
        self.publisher = log.publisher()
        self.awaited = 0  # highest sequence appended: decide again only once it is folded
        self.fence: int | None = None  # seq of this leader's own announcement
        self.landed = 0  # decisions of the last batch that landed (duplicates included)
        self._full_said_at: float | None = None  # when a full store was last warned of

    def reset(self) -> None:
        """Forget positions of a log that is gone (a lost log: sequences start over)."""
        self.awaited = 0
        self.fence = None

    async def expected(self, subject: str) -> int | None:
        """The subject's last sequence as folded; None when the stream is ahead of the fold."""
        seq = self.fold.subject_seq.get(subject)
        if seq is not None or self.fold.complete:
            return seq or 0
        try:
            last = await self.log.last_subject_seq(MOTOR_STREAM, subject)
        except Exception as exc:  # NATS slow or away: no guard to give, so no write
            log.warning("cannot read the last sequence of %s: %s", subject, exc)
            return None
        if last > self.fold.state.last_seq:
            return None  # written after what we folded: fold it first
        self.fold.subject_seq[subject] = last
        return last

    async def announce(self, decision: Decision, may_write: Callable[[], bool]) -> int | None:
        """Append this leader's `controller.leader_changed`; its sequence becomes the fence."""
        if not may_write():
            return None
        expected = await self.expected(subjects.LEADER)
        if expected is None:
            return None
        try:
            seq = await self.publisher.publish(decision.event, expected_last_subject_seq=expected)
        except SequenceConflict as exc:
            self.metrics.conflicts.inc()
            log.info("another controller announced itself first (%s); folding it", exc)
            return None
        except StreamsError as exc:
            self.metrics.append_errors.inc()
            log.warning("announcing the new term failed: %s; trying again", exc)
            return None
        self.fence = seq
        self.awaited = max(self.awaited, seq)
        self.metrics.decisions.labels(decision.event.type).inc()
        log.info("seq %d: %s (every decision is fenced by it)", seq, decision.summary())
        return seq

    async def append(self, decisions: Sequence[Decision], may_write: Callable[[], bool]) -> Outcome:
        """Append a batch in order, all or nothing; `landed` says how many landed (duplicates
        included).

        Each decision went out only after the one before it had its ack, a round trip each: a
        cold start of 1000 nodes spent most of its time there (`just bench fleet`). Now the
        batch is one JetStream atomic batch (`streams.batch`): one ack, and the fence refuses
        all of it or none. A batch holding a decision stored already goes one by one, and the
        first failure decides the outcome.
        """
        self.landed = 0
        fence = self.fence
        if fence is None:
            return Outcome.STOPPED
        outcomes = await self.publisher.publish_batch(
            [d.event for d in decisions],
            expected_last_subject_seq=fence,
            expected_subject=subjects.LEADER,
            go_on=may_write,
        )
        result = Outcome.DONE
        for d, got in zip(decisions, outcomes, strict=False):
            if isinstance(got, int):
                self.awaited = max(self.awaited, got)
                self.metrics.decisions.labels(d.event.type).inc()
                log.info("seq %d: %s", got, d.summary())
                self.landed += 1
            elif result is not Outcome.DONE:
                continue  # the first failure is the one that says what happened
            elif isinstance(got, SequenceConflict):
                self.metrics.fenced.inc()
                log.warning("decision %s refused: %s; another controller leads now", d.summary(), got)
                result = Outcome.FENCED
            else:
                self.metrics.append_errors.inc()
                if self._say(got):
                    log.warning("append of %s failed: %s; retrying on the next tick", d.summary(), got)
                result = Outcome.STOPPED
        if result is Outcome.DONE and self._full_said_at is not None:
            self._full_said_at = None
            log.info("appends land again: the store has room")
        if result is Outcome.DONE and len(outcomes) < len(decisions):
            log.info("lease no longer valid: %d decision(s) not appended", len(decisions) - len(outcomes))
            result = Outcome.STOPPED
        return result

    def _say(self, err: StreamsError) -> bool:
        """Whether to log this failure: a full store is said once every FULL_SAID_EVERY seconds
        (the next tick tries again, and would say it five times a second)."""
        if not isinstance(err, StoreFull):
            return True
        now = time.monotonic()
        if self._full_said_at is not None and now - self._full_said_at < FULL_SAID_EVERY:
            return False
        self._full_said_at = now
        return True
