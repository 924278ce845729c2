"""Honouring a cancellation that nats-py swallowed.

nats-py waits for every request's answer (JetStream publish acks, API calls) with
`asyncio.wait_for`. On Python 3.11 a `task.cancel()` that lands in the same loop iteration as
the answer is swallowed: `wait_for` returns the answer and the task runs on, while
`task.cancelling()` still says it was asked to stop. A loop stopped that way never stops (a
node agent's heartbeat loop kept beating after its agent cancelled it). Calling
`honour_swallowed_cancel()` after such a request raises the lost `CancelledError`, so the caller
stops where it would have stopped, and an enclosing `asyncio.timeout` still turns its own
cancellation into `TimeoutError`.
"""

from __future__ import annotations

import asyncio


def honour_swallowed_cancel() -> None:
    """Raise CancelledError when this task was cancelled and a library's wait_for ate it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
