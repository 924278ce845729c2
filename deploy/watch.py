"""Fold the live log (MOTOR and MOTOR_HB) into a ClusterState for status displays."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

from core.reducer import apply
from core.state import ClusterState
from streams.reader import SkipCounter


class StateWatcher:
    """Follows both streams and keeps `state` current; `caught_up` once they are replayed.

    Through `streams.livefold.LiveFold`: it waits out NATS outages and, when the log is lost,
    starts over from what the log holds now (the view shows the log, not a memory of it).
    """

    def __init__(self, nc: Any, on_event: Callable[[Any], None] | None = None) -> None:
        self.nc = nc
        self.on_event = on_event
        self.state = ClusterState()
        self.caught_up = asyncio.Event()
        self.fold: Any = None  # streams.livefold.LiveFold, made in start()

    async def start(self) -> None:
        from streams.jetstream import JetStreamLog
        from streams.livefold import LiveFold

        self.fold = LiveFold(
            JetStreamLog(self.nc),
            self._event,
            heartbeats=self._heartbeat,
            on_lost=self._lost,
            name="motor-up view",
            caught_up=self.caught_up,
        )
        await self.fold.start()

    def _event(self, rec: Any) -> None:
        self.state = apply(self.state, rec.event, rec.seq)
        if self.on_event is not None:
            self.on_event(rec)

    def _heartbeat(self, rec: Any) -> None:
        self.state = apply(self.state, rec.event, 0)

    def _lost(self, loss: Any) -> None:
        self.state = ClusterState()

    def health(self) -> str:
        """How the fold fares (for diagnostics): following or waiting, position, skips, lost logs."""
        if self.fold is None:
            return "not started"
        return str(self.fold.health().describe())

    async def stop(self) -> None:
        if self.fold is not None:
            await self.fold.close()


async def snapshot_state(nc: Any) -> ClusterState:
    """Fold what the log holds now (MOTOR, then the latest heartbeats) and return it.

    Events the fold cannot use are skipped (`streams.offline`), never a traceback.
    """
    from streams.definitions import HB_STREAM
    from streams.offline import fold_stream
    from streams.reader import read_range

    state, _ = await fold_stream(nc)
    async for rec in read_range(nc, HB_STREAM, skips=SkipCounter(HB_STREAM, quiet=True)):
        with contextlib.suppress(Exception):  # a heartbeat the reducer cannot use changes nothing
            state = apply(state, rec.event, 0)  # not a MOTOR sequence
    return state


async def coordinator_serves(base: str) -> bool:
    """Whether the coordinator says it can serve (its `/readiness`: some model has a usable
    path), which an ACTIVE instance alone does not make so (a P/D pair's decode serves no
    request without its prefill)."""
    import aiohttp

    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as s,
            s.get(f"{base}/readiness") as r,
        ):
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False
