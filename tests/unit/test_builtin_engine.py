"""The builtin engine core: timing model, FIFO admission by KV blocks, aborts, accounting."""

from __future__ import annotations

import asyncio

import pytest

from simengine.engine import Engine, Job
from simengine.injection import Faults
from simengine.openai_api import ApiError, GenRequest, parse_completion
from simengine.options import EngineOptions, FaultSpec, Speeds

SPEEDS = Speeds(ttft_base_ms=10, prefill_tokens_per_s=1000, itl_ms=5, itl_per_running_ms=1)


def engine(**kw: object) -> Engine:
    settings = EngineOptions(port=1, speeds=SPEEDS, **kw)  # type: ignore[arg-type]
    return Engine(settings, Faults(settings.faults))


def req(prompt: str, max_tokens: int = 4, **extra: object) -> GenRequest:
    return parse_completion({"prompt": prompt, "max_tokens": max_tokens, **extra}, ("motor-sim",))


def test_itl_grows_with_the_running_batch_and_slow_tokens() -> None:
    e = engine()
    assert e.itl_seconds() == pytest.approx(0.005)
    e.running = 11
    assert e.itl_seconds() == pytest.approx(0.015)
    e.faults.update({"slow_tokens_ms": 20})
    assert e.itl_seconds() == pytest.approx(0.035)


def test_fast_mode_has_no_time_but_slow_tokens() -> None:
    e = engine(fast=True, faults=FaultSpec(slow_tokens_ms=3))
    job = e.prepare(req("x " * 100))
    assert e.prefill_seconds(job) == 0 and e.itl_seconds() == pytest.approx(0.003)


def test_ttft_grows_with_uncached_prompt_tokens() -> None:
    e = engine()
    short = e.prepare(req("a b c d"))
    long = e.prepare(req(" ".join(f"w{i}" for i in range(500))))
    assert e.prefill_seconds(short) == pytest.approx(0.010 + 0.004)
    assert e.prefill_seconds(long) == pytest.approx(0.010 + 0.5)
    assert e.try_admit(long)
    e.finish(long, "length")
    again = e.prepare(req(" ".join(f"w{i}" for i in range(500))))
    assert e.try_admit(again)
    assert again.cached_tokens == 496  # 31 full blocks; the last prompt token is always computed
    assert e.prefill_seconds(again) == pytest.approx(0.010 + 0.004)


async def test_prefills_queue_behind_each_other() -> None:
    e = engine()
    a = e.prepare(req(" ".join(f"a{i}" for i in range(100))))
    b = e.prepare(req(" ".join(f"b{i}" for i in range(100))))
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    done: list[float] = []

    async def run(job: Job) -> None:
        await e.prefill(job)
        done.append(loop.time() - t0)

    await asyncio.gather(run(a), run(b))
    assert done[0] >= 0.10 and done[1] >= 0.2  # the second waited for the first


async def test_waiters_are_admitted_in_order_when_blocks_free() -> None:
    e = engine(num_blocks=4, block_size=4)
    first = e.prepare(req("a b c d e f g h", 8))
    assert e.try_admit(first)  # 16 tokens = 4 blocks: all of them
    second = e.prepare(req("x", 3))
    third = e.prepare(req("y", 3))
    t2 = asyncio.ensure_future(e.admit(second))
    t3 = asyncio.ensure_future(e.admit(third))
    await asyncio.sleep(0)
    assert e.gauges()[:2] == (1, 2) and not t2.done()
    e.finish(first, "length")
    await asyncio.gather(t2, t3)
    assert second.alloc is not None and third.alloc is not None
    assert e.gauges() == (2, 0, 0.5)


async def test_abort_while_waiting_leaves_the_queue() -> None:
    e = engine(num_blocks=1, block_size=4)
    holder = e.prepare(req("a", 3))
    assert e.try_admit(holder)
    waiter = e.prepare(req("b", 3, rid="w"))
    e.register(waiter)
    task = asyncio.ensure_future(e.admit(waiter))
    await asyncio.sleep(0)
    assert e.abort("w") and not e.abort("nobody")
    await task
    assert waiter.alloc is None and len(e.waiting) == 0
    e.finish(waiter, "abort")
    assert e.metrics.finished["abort"] == 1 and "w" not in e.jobs


def test_context_and_capacity_limits() -> None:
    e = engine(max_model_len=32, num_blocks=2, block_size=4)
    with pytest.raises(ApiError, match="maximum context length is 32"):
        e.prepare(req("a b", 31))
    with pytest.raises(ApiError, match="KV cache"):
        e.prepare(req("a b", 10))


def test_sglang_prefill_cap_plans_one_token() -> None:
    e = engine()
    job = e.prepare(req("a b", 50), cap=1)
    assert job.plan.completion_tokens == 1
