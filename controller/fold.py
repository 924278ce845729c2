"""The controller's live fold: the state, each subject's last folded sequence, and waiters.

MOTOR records are folded at their stream sequence; heartbeats (MOTOR_HB, a different
sequence space) are folded at sequence 0 so `state.last_seq` stays a MOTOR position. The
per-subject sequences are what the appender turns into `expected_last_subject_seq`.
"""

from __future__ import annotations

import asyncio
import time

from core.reducer import apply
from core.state import ClusterState
from streams.reader import Record


class Fold:
    """State folded so far; no I/O."""

    def __init__(self, state: ClusterState | None = None) -> None:
        self.state = state if state is not None else ClusterState()
        # Complete only when folded from the first sequence: after a checkpoint, subjects last
        # written before it are unknown here and must be looked up (see Appender.expected).
        self.complete = state is None or state.last_seq == 0
        self.subject_seq: dict[str, int] = {}
        self.changed = asyncio.Event()  # set on every MOTOR event; the decide loop clears it
        self.motor_events = 0
        self.hb_events = 0
        self.lag = 0.0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []

    def motor(self, rec: Record) -> None:
        """Fold one MOTOR record."""
        self.state = apply(self.state, rec.event, rec.seq)
        self.subject_seq[rec.subject] = rec.seq
        self.motor_events += 1
        self.lag = max(0.0, time.time() - rec.event.ts)
        self.changed.set()
        if self._waiters:
            self._wake()

    def heartbeat(self, rec: Record) -> None:
        """Fold one heartbeat (not a MOTOR position, so at sequence 0)."""
        self.state = apply(self.state, rec.event, 0)
        self.hb_events += 1

    def _wake(self) -> None:
        seq = self.state.last_seq
        keep = []
        for want, fut in self._waiters:
            if fut.done():
                continue
            if want <= seq:
                if not fut.done():
                    fut.set_result(None)
            else:
                keep.append((want, fut))
        self._waiters = keep

    async def reached(self, seq: int, within: float) -> bool:
        """Wait until MOTOR is folded to at least `seq`; False on timeout."""
        if self.state.last_seq >= seq:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((seq, fut))
        try:
            async with asyncio.timeout(within):
                await fut
        except TimeoutError:
            return False
        finally:
            fut.cancel()  # a no-op when resolved; drops a waiter that timed out
        return True
