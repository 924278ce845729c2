"""Keeping the agent's parts running: a part that fails is logged, counted and started again.

The parts (command consumer, heartbeats, resync observer, fault reporter, snapshot loop) run
until the agent stops. None may take the agent down with it: an agent that exits stops its
engines, and a NATS timeout is no reason to stop serving. A part that raises, returns, or is
cancelled from inside (nats-py cancels its own pending requests when a connection drops) is
started again after a delay that doubles while it keeps failing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

Part = Callable[[], Awaitable[None]]


async def keep_running(
    name: str,
    run: Part,
    on_restart: Callable[[str], None],
    *,
    initial: float = 1.0,
    max_delay: float = 30.0,
    healthy_after: float = 60.0,
) -> None:
    """Run `run()` until this task is cancelled, starting it again whenever it ends."""
    loop = asyncio.get_running_loop()
    delay = initial
    while True:
        started = loop.time()
        if_failed = "returned"
        try:
            await run()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            if_failed = "was cancelled from inside"
        except Exception:
            if_failed = "failed"
            log.exception("part %s failed", name)
        if loop.time() - started >= healthy_after:
            delay = initial  # it ran fine for a while: this is a new failure, not a loop
        log.warning("part %s %s; starting it again in %.1fs", name, if_failed, delay)
        on_restart(name)
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_delay)
