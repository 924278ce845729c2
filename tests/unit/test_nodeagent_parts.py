"""keep_running: a part that fails, returns or is cancelled from inside is started again."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from nodeagent.parts import keep_running


async def test_a_failing_part_is_started_again_and_counted() -> None:
    runs = 0
    forever, fourth = asyncio.Event(), asyncio.Event()
    restarted: list[str] = []

    async def part() -> None:
        nonlocal runs
        runs += 1
        if runs == 1:
            raise TimeoutError("nats: timeout")  # what an ack that timed out raised
        if runs == 2:
            return  # a loop that ended on its own
        if runs == 3:
            raise asyncio.CancelledError  # nats-py cancelled its own request under us
        fourth.set()
        await forever.wait()

    task = asyncio.create_task(keep_running("commands", part, restarted.append, initial=0.01))
    async with asyncio.timeout(5):
        await fourth.wait()
    assert restarted == ["commands"] * 3
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_cancelling_the_part_task_stops_it() -> None:
    started = asyncio.Event()

    async def part() -> None:
        started.set()
        await asyncio.Event().wait()

    restarted: list[str] = []
    task = asyncio.create_task(keep_running("heartbeats", part, restarted.append, initial=0.01))
    await started.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled() and restarted == []
