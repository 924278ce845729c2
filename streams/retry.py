"""Start-up steps that talk to NATS, tried until they succeed: NATS slow or away is waited out.

A process that exits because NATS did not answer a start-up request in time (creating a
stream, binding a consumer, loading a checkpoint) only comes back to ask again, and a fleet of
them restarting together is what made NATS slow. The pause doubles up to `RETRY_MAX` with
jitter, so a thousand node agents refused at once do not all ask again in the same instant.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

from streams.errors import StreamsError

T = TypeVar("T")

RETRY_FIRST = 0.2
RETRY_MAX = 5.0  # longest pause between two tries of a start-up step


class Abandoned(StreamsError):
    """Stop was asked while a start-up step was still being tried."""


async def until_done(
    what: str, step: Callable[[], Awaitable[T]], log: logging.Logger, *, stop: asyncio.Event | None = None
) -> T:
    """Run `step` until it succeeds and return its result; failures are logged on `log` as
    `cannot <what> yet`, the first one and every 20th. Raises Abandoned once `stop` is set
    (checked between tries)."""
    delay, tries = RETRY_FIRST, 0
    while True:
        try:
            result = await step()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            tries += 1
            if tries == 1 or tries % 20 == 0:
                log.warning(
                    "cannot %s yet (%s); trying again (try %d)", what, exc or type(exc).__name__, tries
                )
        else:
            if tries:
                log.info("%s: done after %d failed tries", what, tries)
            return result
        pause = delay * random.uniform(0.5, 1.5)
        if stop is None:
            await asyncio.sleep(pause)
        else:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(pause):  # not wait_for: it can eat a cancel on 3.11
                    await stop.wait()
            if stop.is_set():
                raise Abandoned(f"stopped while trying to {what} ({tries} tries)")
        delay = min(delay * 2, RETRY_MAX)
