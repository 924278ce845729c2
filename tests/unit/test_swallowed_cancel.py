"""A cancel that nats-py's `wait_for` swallows is honoured by the next `honour_swallowed_cancel`.

nats-py waits for a request's answer with `asyncio.wait_for`; on Python 3.11 a cancel landing
in the same loop iteration as the answer is lost. These tests make that race happen on
purpose (the answer and the cancel in one iteration) instead of waiting for it under load.
"""

from __future__ import annotations

import asyncio
import sys

import pytest

from streams.cancelling import honour_swallowed_cancel


async def _request_like_nats_py(answer: asyncio.Future[int]) -> int:
    return await asyncio.wait_for(answer, 10.0)  # what nats-py's Client.request does


async def _answer_and_cancel_together(body: asyncio.Task[object], answer: asyncio.Future[int]) -> None:
    await asyncio.sleep(0)  # the body is now waiting inside wait_for
    answer.set_result(7)
    body.cancel()


async def test_a_loop_stops_when_a_request_swallowed_its_cancel() -> None:
    loop = asyncio.get_running_loop()
    answers: list[asyncio.Future[int]] = [loop.create_future()]
    rounds = 0

    async def beat_loop() -> None:
        nonlocal rounds
        while True:
            rounds += 1
            await _request_like_nats_py(answers[-1])
            honour_swallowed_cancel()
            answers.append(loop.create_future())
            await asyncio.sleep(0.01)

    task: asyncio.Task[object] = asyncio.create_task(beat_loop())
    await _answer_and_cancel_together(task, answers[0])
    with pytest.raises(asyncio.CancelledError):
        async with asyncio.timeout(5):
            await task
    assert rounds == 1


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's wait_for no longer swallows a cancel")
async def test_without_it_the_cancel_is_lost() -> None:
    """The race is real on the Python we run: the same loop without the check keeps going."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[int] = loop.create_future()
    after = asyncio.Event()

    async def body() -> None:
        await _request_like_nats_py(answer)
        after.set()
        await asyncio.sleep(3600)

    task: asyncio.Task[object] = asyncio.create_task(body())
    await _answer_and_cancel_together(task, answer)
    async with asyncio.timeout(5):
        await after.wait()
    assert task.cancelling() == 1 and not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_enclosing_timeout_still_reads_as_a_timeout() -> None:
    """When the swallowed cancel was asyncio.timeout's own, the caller sees TimeoutError."""
    loop = asyncio.get_running_loop()
    answer: asyncio.Future[int] = loop.create_future()

    async def expire_with_the_answer(cm: asyncio.Timeout) -> None:
        await asyncio.sleep(0)
        answer.set_result(1)
        cm.reschedule(loop.time() - 1)  # the deadline passes in the answer's iteration

    async def body() -> str:
        try:
            async with asyncio.timeout(None) as cm:
                expiring = asyncio.create_task(expire_with_the_answer(cm))
                await _request_like_nats_py(answer)
                honour_swallowed_cancel()
                await asyncio.sleep(3600)
        except TimeoutError:
            return "timed out"
        finally:
            await expiring
        return "ran on"

    async with asyncio.timeout(5):
        assert await body() == "timed out"


async def test_an_uncancelled_task_is_left_alone() -> None:
    honour_swallowed_cancel()  # nothing asked this task to stop
