"""The coordinator's fold of the log: MOTOR events and MOTOR_HB heartbeats into its table.

Through `streams.livefold.LiveFold`, so an outage, a stream away for a while, a poison event
or a lost log are handled where every other fold handles them. The coordinator keeps
serving from memory across a lost log: its table is not emptied, the new log is folded on
top of it (nodes register again and instances are re-adopted under their ids, so the
result converges on what the controller rebuilds), and what was routable stays so while
the new log re-adopts it (`coordinator.losshold`, for at most HOLD_FOR seconds).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from coordinator.context import CoordinatorContext
from core import subjects
from streams.definitions import HB_STREAM, MOTOR_STREAM
from streams.livefold import LiveFold
from streams.log import Log
from streams.lostlog import Loss
from streams.poison import Skipped
from streams.reader import Record

log = logging.getLogger(__name__)

HOLD_FOR = 60.0  # the longest a lost log's re-adoption may take before the new log alone decides


def follow_log(
    ctx: CoordinatorContext, motor: Log, *, name: str = "coordinator", clock: Callable[[], float] = time.time
) -> LiveFold:
    """A LiveFold of `motor` feeding `ctx` (not started); `ctx.wait_applied` waits on it."""

    motor_lag = ctx.metrics.fold_lag.labels(MOTOR_STREAM)
    hb_lag = ctx.metrics.fold_lag.labels(HB_STREAM)
    caught_up = ctx.caught_up

    def events(rec: Record) -> None:
        ctx.apply(rec.event, rec.seq)
        if rec.appended and caught_up.is_set():  # replayed at start-up: old, not late
            motor_lag.observe(max(0.0, clock() - rec.appended))

    def heartbeats(rec: Record) -> None:
        ctx.apply(rec.event, 0)  # not a MOTOR sequence
        if rec.appended and caught_up.is_set():
            hb_lag.observe(max(0.0, clock() - rec.appended))

    def skipped(s: Skipped) -> None:
        ctx.metrics.events_skipped.labels(s.reason).inc()

    release: asyncio.TimerHandle | None = None

    def lost(loss: Loss) -> None:
        nonlocal release
        ctx.metrics.log_lost.inc()
        held = ctx.table.hold_across_loss()
        if release is not None:
            release.cancel()
        release = asyncio.get_running_loop().call_later(HOLD_FOR, ctx.table.release_hold)
        log.warning(
            "the log was lost (%s): serving from the table as it is, folding the new log on top; "
            "%d routable endpoint(s) held while the new log re-adopts them (at most %g s)",
            loss,
            held,
            HOLD_FOR,
        )
        if loss.kind != "purged":
            ctx.table.last_seq = 0  # sequences start over: report the new log's position

    fold = LiveFold(
        motor,
        events,
        filter_subject=subjects.ALL_EVENTS,
        heartbeats=heartbeats,
        on_lost=lost,
        on_skip=skipped,
        name=name,
        caught_up=ctx.caught_up,
        clock=clock,
    )
    ctx.log = fold
    return fold
