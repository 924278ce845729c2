"""Fold the live log (MOTOR and MOTOR_HB) into a ClusterState for status displays."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from core.reducer import apply
from core.state import ClusterState


class StateWatcher:
    """Follows both streams and keeps `state` current; `caught_up` once MOTOR is replayed."""

    def __init__(self, nc: Any, on_event: Callable[[Any], None] | None = None) -> None:
        self.nc = nc
        self.on_event = on_event
        self.state = ClusterState()
        self.caught_up = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._followers: list[Any] = []

    async def start(self) -> None:
        from streams.definitions import HB_STREAM, MOTOR_STREAM
        from streams.reader import Follower

        main = Follower(self.nc, MOTOR_STREAM)
        hb = Follower(self.nc, HB_STREAM)
        self._followers = [main, hb]
        self._tasks = [
            asyncio.create_task(self._run(main, is_main=True)),
            asyncio.create_task(self._run(hb, is_main=False)),
        ]

        async def mark() -> None:
            await main.caught_up.wait()
            self.caught_up.set()

        self._tasks.append(asyncio.create_task(mark()))

    async def _run(self, follower: Any, *, is_main: bool) -> None:
        async for rec in follower:
            self.state = apply(self.state, rec.event, rec.seq if is_main else 0)
            if self.on_event is not None and is_main:
                self.on_event(rec)

    def health(self) -> str:
        """'following', or why a follower task ended (for diagnostics)."""
        for t in self._tasks:
            if t.done() and not t.cancelled() and t.exception() is not None:
                return f"failed: {t.exception()!r}"
        detail = ", ".join(
            f"{f.stream}: seq {f.last_seq}, {f.transport or 'not started'}, {f.resets} resets"
            for f in self._followers
        )
        return f"following ({detail})"

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for f in self._followers:
            with contextlib.suppress(Exception):
                await f.close()


async def snapshot_state(nc: Any) -> ClusterState:
    """Fold what the log holds now (MOTOR, then the latest heartbeats) and return it."""
    from streams.definitions import HB_STREAM, MOTOR_STREAM
    from streams.reader import read_range

    state = ClusterState()
    async for rec in read_range(nc, MOTOR_STREAM):
        state = apply(state, rec.event, rec.seq)
    async for rec in read_range(nc, HB_STREAM):
        state = apply(state, rec.event, 0)
    return state
