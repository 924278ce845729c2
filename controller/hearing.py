"""Whether heartbeats can reach the log at all: a probe of the heartbeat stream's leader.

A stream in a JetStream cluster takes no write while it has no leader (its server died or was
cut off, and the others wait out Raft's 4-9 s election timeout); every node's heartbeat is
lost meanwhile. The controller's consumer sees only silence, which `liveness` would charge to
the nodes: with a `heartbeat_timeout` shorter than an election, every instance goes INACTIVE
because of the log. So the controller asks the stream a question only its leader answers
(its info) every `every` seconds; while that goes unanswered the controller is deaf, and once it
is answered again every node gets its whole `heartbeat_timeout` from then on, as after an
outage of NATS itself. Nor does silence grow past the moment of the last question answered
(`answered_asked_at`, the controller's `heard_until`): a node is charged only for time the
stream was known to take heartbeats, however long noticing the outage took.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from streams.definitions import HB_STREAM
from streams.log import Log

log = logging.getLogger(__name__)

PROBE_EVERY = 1.0
# How long an answer may take before the stream counts as leaderless: longer than a busy
# machine's worst answer, so a slow reply never deafens the controller.
ANSWER_WITHIN = 2.0
STILL_DOWN_EVERY = 60.0  # seconds between warnings while it stays unanswered


class HeartbeatPath:
    """Follows whether the heartbeat stream answers; `back_since` is when it last came back."""

    def __init__(
        self,
        motor: Log,
        clock: Callable[[], float],  # monotonic: `back_since` and `answered_asked_at` are `Hearing`'s
        *,
        every: float = PROBE_EVERY,
        answer_within: float = ANSWER_WITHIN,
    ) -> None:
        self.motor = motor
        self.clock = clock
        self.every = every
        self.answer_within = answer_within
        self.down = False
        self.down_since = self.warned_at = 0.0
        self.back_since = 0.0
        self.outages = 0
        # When the last question the stream answered was asked: heartbeats could land up to
        # then (None until the first answer).
        self.answered_asked_at: float | None = None

    async def probe(self) -> bool:
        """Ask once; True when the stream's leader answered within `answer_within`."""
        asked = self.clock()
        try:
            await self.motor.stream_info(HB_STREAM, wait=self.answer_within)
        except Exception as exc:  # no leader, NATS away, no permission: heartbeats are not landing
            now = self.clock()
            if not self.down:
                self.down = True
                self.down_since = self.warned_at = now
                self.outages += 1
                log.warning("%s does not answer (%s): no node is judged silent until it does", HB_STREAM, exc)
            elif now - self.warned_at >= STILL_DOWN_EVERY:
                self.warned_at = now
                log.warning(
                    "%s has not answered for %.0f s (%s): no node is judged silent meanwhile",
                    HB_STREAM,
                    now - self.down_since,
                    exc,
                )
            return False
        self.answered_asked_at = asked
        if self.down:
            self.down = False
            self.back_since = self.clock()
            log.info("%s answers again: every node's heartbeat timeout starts over", HB_STREAM)
        return True

    async def run(self) -> None:
        """Probe for ever, one question every `every` seconds."""
        while True:
            began = self.clock()
            await self.probe()
            await asyncio.sleep(max(0.0, self.every - (self.clock() - began)))
