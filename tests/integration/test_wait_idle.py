"""`motor wait-idle` (the coordinator's PreStop) against a real coordinator serving a real stream."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from nats.js import JetStreamContext

from deploy.cmd_wait_idle import in_flight, wait_idle
from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.integration.coord_harness import (
    MODEL,
    ROOT,
    Cluster,
    Coordinator,
    Engine,
    start_coordinator,
    start_engine,
    stream_text,
    wait_routable,
)

ITL_MS = 40  # the engine's time between tokens: a 60-token stream takes ~2.4 s


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Engine]:
    eng = await start_engine(tmp_path_factory.mktemp("eng"), "union", "--itl-ms", str(ITL_MS))
    yield eng
    eng.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def coord(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, engine: Engine
) -> AsyncIterator[Coordinator]:
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        await Cluster(Publisher(js)).add(engine)
        await wait_routable(c)
        yield c
    finally:
        c.stop()


async def _wait_idle(coord: Coordinator, give_up: float) -> tuple[int, str, float]:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deploy.cli", "wait-idle", "--url", f"{coord.url}/metrics",
        "--settle", "0", "--timeout", str(give_up), "--interval", "0.1",
        cwd=ROOT, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err = await asyncio.wait_for(proc.communicate(), give_up + 30)
    return proc.returncode or 0, err.decode(), time.monotonic() - started


def _body(tokens: int) -> dict[str, object]:
    return {
        "model": MODEL,
        "prompt": "Tell me about rivers.",
        "max_tokens": tokens,
        "stream": True,
        "ignore_eos": True,
    }


async def _first_in_flight(coord: Coordinator) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(200):
            async with s.get(f"{coord.url}/metrics") as r:
                if in_flight(await r.text()) > 0:
                    return
            await asyncio.sleep(0.02)
    raise AssertionError("the stream never showed up in flight")


async def test_it_returns_once_the_stream_in_flight_has_finished(coord: Coordinator) -> None:
    async with aiohttp.ClientSession() as s:
        stream = asyncio.create_task(stream_text(s, f"{coord.url}/v1/completions", _body(60)))
        await _first_in_flight(coord)
        rc, err, took = await _wait_idle(coord, give_up=30)
        assert rc == 0, err
        assert "no request in flight" in err
        text, chunks = await asyncio.wait_for(stream, 5)  # done by then, or within moments
    assert chunks[-1] == {"done": True} and text
    assert took > 1.0, f"returned after {took:.2f} s, before the ~2.4 s stream could finish"


async def test_it_gives_up_at_its_timeout_and_says_how_many_are_left(coord: Coordinator) -> None:
    async with aiohttp.ClientSession() as s:
        stream = asyncio.create_task(stream_text(s, f"{coord.url}/v1/completions", _body(200)))
        await _first_in_flight(coord)
        rc, err, took = await _wait_idle(coord, give_up=1)
        assert rc == 1 and "1 requests still in flight" in err
        assert took < 8
        await asyncio.wait_for(stream, 30)


def test_an_unreadable_metrics_url_is_one_line() -> None:
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "wait-idle", "--url", "http://127.0.0.1:9/metrics", "--settle", "0"],
        capture_output=True, text=True, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert (
        proc.returncode == 1
        and proc.stderr.startswith("motor wait-idle: cannot read")
        and "Traceback" not in proc.stderr
    )
    proc = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "wait-idle", "--interval", "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 2 and "--interval must be positive" in proc.stderr


def test_the_settle_time_comes_first_and_the_clock_bounds_the_wait() -> None:
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    busy = '# TYPE motor_coordinator_endpoint_inflight gauge\nmotor_coordinator_endpoint_inflight{endpoint="a",role="union"} 2.0\n'
    assert wait_idle(lambda: busy, settle=5, timeout=7, interval=1, clock=lambda: now[0], sleep=sleep) == (
        False,
        2,
    )
    assert slept[0] == 5 and now[0] == 7
