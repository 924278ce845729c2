"""The simulator's event loop: virtual time, determinism, frozen and killed processes."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from tests.sim.loop import Deadlock, Proc, SimLoop


def run(coro_fn):  # type: ignore[no-untyped-def]
    loop = SimLoop()
    try:
        return loop.run_until_complete(coro_fn(loop))
    finally:
        loop.close()


def test_an_hour_of_timers_passes_at_once_on_the_virtual_clock() -> None:
    async def main(loop: SimLoop) -> float:
        for _ in range(3600):
            await asyncio.sleep(1.0)
        return loop.time()

    began = time.monotonic()
    assert run(main) == pytest.approx(3600.0)
    assert time.monotonic() - began < 5.0


def test_timeouts_fire_on_virtual_time() -> None:
    async def main(loop: SimLoop) -> float:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(30.0):
                await asyncio.get_running_loop().create_future()
        return loop.time()

    assert run(main) == pytest.approx(30.0)


def test_the_same_program_takes_the_same_steps() -> None:
    def trace() -> list[tuple[float, int]]:
        out: list[tuple[float, int]] = []

        async def worker(i: int, rng: random.Random, loop: SimLoop) -> None:
            for _ in range(20):
                await asyncio.sleep(rng.choice([0.0, 0.001, 0.5, 1.0]))
                out.append((loop.time(), i))

        async def main(loop: SimLoop) -> None:
            rng = random.Random(7)
            await asyncio.gather(*(worker(i, rng, loop) for i in range(10)))

        run(main)
        return out

    assert trace() == trace()


def test_a_frozen_process_misses_time_and_catches_up_late() -> None:
    async def main(loop: SimLoop) -> tuple[list[float], list[float]]:
        frozen_ticks: list[float] = []
        other_ticks: list[float] = []
        a, b = Proc("a"), Proc("b")

        async def tick(out: list[float]) -> None:
            while True:
                await asyncio.sleep(1.0)
                out.append(loop.time())

        loop.spawn(a, tick(frozen_ticks))
        loop.spawn(b, tick(other_ticks))
        await asyncio.sleep(2.5)
        loop.freeze(a)
        await asyncio.sleep(5.0)
        loop.thaw(a)
        await asyncio.sleep(0.1)
        return frozen_ticks, other_ticks

    frozen, other = run(main)
    assert frozen == [1.0, 2.0, 7.5]  # the timer due at 3.0 ran when thawed, then nothing
    assert other[:7] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]


def test_an_answer_that_came_while_frozen_beats_its_timeout_after_the_thaw() -> None:
    """Both the wake-up and the expired timeout wait out the freeze; the wake-up came first, so
    the task leaves its `asyncio.timeout` block and the late timeout must not fire into it."""

    async def main(loop: SimLoop) -> str:
        p = Proc("p")
        fut: asyncio.Future[str] = loop.create_future()
        got: list[str] = []

        async def waiter() -> None:
            async with asyncio.timeout(2.0):
                got.append(await fut)
            await asyncio.sleep(5.0)
            got.append("after")

        loop.spawn(p, waiter())
        await asyncio.sleep(1.0)
        loop.freeze(p)
        await asyncio.sleep(0.5)
        fut.set_result("answer")
        await asyncio.sleep(5.0)  # the timeout (due at 2.0) waits in the freeze too
        loop.thaw(p)
        await asyncio.sleep(6.0)
        return ",".join(got)

    assert run(main) == "answer,after"


def test_a_killed_process_never_runs_again_not_even_its_finally() -> None:
    async def main(loop: SimLoop) -> list[str]:
        seen: list[str] = []
        p = Proc("p")

        async def victim() -> None:
            try:
                await asyncio.sleep(10.0)
                seen.append("woke")
            finally:
                seen.append("finally")

        loop.spawn(p, victim())
        await asyncio.sleep(1.0)
        loop.kill(p)
        await asyncio.sleep(20.0)
        return seen

    assert run(main) == []


def test_waiting_for_what_cannot_come_is_a_deadlock() -> None:
    async def main(loop: SimLoop) -> None:
        await loop.create_future()

    with pytest.raises(Deadlock):
        run(main)
