"""The controller's live fold: the state, each subject's last folded sequence, and when each
node was last heard (`heard_at`, on the monotonic clock: silence is judged on it, controller.heard).

MOTOR records are folded at their stream sequence; heartbeats (MOTOR_HB, a different
sequence space) are folded at sequence 0 so `state.last_seq` stays a MOTOR position. The
leader subject's sequence is what the appender guards its announcement with. Waiting for a
sequence is `streams.livefold.LiveFold.wait_for` (it also counts skipped events).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from controller.heard import note
from core.reducer import apply
from core.state import ClusterState
from streams.reader import Record


class Fold:
    """State folded so far; no I/O."""

    def __init__(
        self,
        state: ClusterState | None = None,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.monotonic = monotonic  # when a node was heard (controller.heard): no wall clock
        self.changed = asyncio.Event()  # set on every MOTOR event; the decide loop clears it
        self.reset(state)

    def reset(self, state: ClusterState | None = None) -> None:
        """Start over from `state` (a checkpoint) or from nothing (a lost log)."""
        self.state = state if state is not None else ClusterState()
        # Complete only when folded from the first sequence: after a checkpoint, subjects last
        # written before it are unknown here and must be looked up (see Appender.expected).
        self.complete = state is None or state.last_seq == 0
        self.subject_seq: dict[str, int] = {}
        # node id -> monotonic time its last heartbeat or registration was folded; a
        # checkpoint's nodes were never heard by this process (controller.heard)
        self.heard_at: dict[str, float] = {}
        self.motor_events = 0
        self.hb_events = 0
        self.lag = 0.0
        self.changed.set()

    def motor(self, rec: Record) -> None:
        """Fold one MOTOR record (raises what the reducer raises: LiveFold counts it)."""
        self.state = apply(self.state, rec.event, rec.seq)
        self.subject_seq[rec.subject] = rec.seq
        note(self.heard_at, self.state, rec.event, self.monotonic())
        self.motor_events += 1
        self.lag = max(0.0, self.clock() - rec.event.ts)
        self.changed.set()

    def heartbeat(self, rec: Record) -> None:
        """Fold one heartbeat (not a MOTOR position, so at sequence 0)."""
        self.state = apply(self.state, rec.event, 0)
        note(self.heard_at, self.state, rec.event, self.monotonic())
        self.hb_events += 1
