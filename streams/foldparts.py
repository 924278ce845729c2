"""The parts of a LiveFold that hold state: one lane per followed stream, and its health report."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from streams.log import Ordered


@dataclass(frozen=True, slots=True)
class FoldHealth:
    """What a LiveFold knows about itself, for probes, metrics and `motor up`'s view."""

    connected: bool  # the NATS client is connected
    following: bool  # every stream is present and its consumer delivering
    caught_up: bool
    position: int  # MOTOR sequence of the last message handled (applied or skipped)
    stream_last_seq: int  # at the last check
    lag: int  # messages the stream held beyond `position` at the last check
    skipped: dict[str, int]
    resets: int  # consumer recreations (outages, gaps, lost heartbeats)
    lost: int  # times the log was found lost and the fold started over
    hearing_since: float  # when delivery last (re)started, on the fold's clock

    def describe(self) -> str:
        """One line for logs and status displays."""
        state = "following" if self.following else "waiting for the log"
        skipped = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items())) or "none"
        return (
            f"{state}; seq {self.position} (lag {self.lag}); {self.resets} resets, "
            f"{self.lost} lost-log restarts; skipped: {skipped}"
        )


class Lane:
    """One stream's consumer loop inside a LiveFold."""

    def __init__(self, stream: str) -> None:
        self.stream = stream
        self.caught_up = False
        self.away = False  # the stream is missing (or replaced) and the lane waits for the watcher
        self.missing = False  # the watcher found no stream at its last check
        self.back = asyncio.Event()
        self.created: str | None = None
        self.consumer: Ordered | None = None
        self.task: asyncio.Task[None] | None = None
        self.resets = 0  # of consumers already closed
        self.reconnects = 0  # the connection's reconnects when its consumer was last made

    @property
    def delivering(self) -> bool:
        """The stream is there and its consumer delivers (not being recreated)."""
        return not self.away and self.consumer is not None and self.consumer.delivering
