"""A coordinator replica going away gracefully (issue 21 item 1, its coordinator part): on
SIGTERM it stops accepting and says not-ready, answers every request under way to its end,
and exits; 32 concurrent streams through it lose nothing. A drain that outlasts
`drain_timeout` cuts what is left, and the process still exits."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp
import pytest
from nats.js import JetStreamContext

from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.integration.coord_harness import (
    MODEL,
    Cluster,
    start_coordinator,
    start_engine,
    stream_text,
    wait_routable,
)

TOKENS = 40


async def test_sigterm_answers_every_stream_under_way_then_exits(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    eng = await start_engine(tmp_path, "union", "--fast", "--slow-tokens-ms", "50")  # a stream: 2 s
    c = await start_coordinator(tmp_path, nats_server.url, drain_timeout=30)
    try:
        await Cluster(Publisher(js)).add(eng)
        await wait_routable(c)
        body = {"model": MODEL, "prompt": "A long story", "max_tokens": TOKENS, "stream": True}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as s:
            streams = [
                asyncio.create_task(stream_text(s, f"{c.url}/v1/completions", body)) for _ in range(32)
            ]
            await asyncio.sleep(0.6)  # every stream under way
            c.proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            await asyncio.sleep(0.3)
            with pytest.raises(aiohttp.ClientConnectionError):  # it takes no new connection
                async with aiohttp.ClientSession() as fresh:
                    await fresh.get(f"{c.url}/liveness")
            results = await asyncio.wait_for(asyncio.gather(*streams), 30)
        for text, chunks in results:
            pieces = [ch for ch in chunks if "choices" in ch and ch["choices"][0]["text"]]
            assert len(pieces) == TOKENS and chunks[-1] == {"done": True} and text
        assert c.proc.wait(15) == 0
        assert time.monotonic() - t0 < 10  # it left once they were answered, not after 30 s
        log = c.log_text()
        assert "draining: " in log and "drained: every request under way was answered" in log
    finally:
        c.stop()
        eng.stop()


async def test_a_drain_past_its_timeout_cuts_what_is_left_and_exits(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    eng = await start_engine(tmp_path, "union", "--fast", "--slow-tokens-ms", "200")  # 40 tokens: 8 s
    c = await start_coordinator(tmp_path, nats_server.url, drain_timeout=1)
    try:
        await Cluster(Publisher(js)).add(eng)
        await wait_routable(c)
        body = {"model": MODEL, "prompt": "A long story", "max_tokens": TOKENS, "stream": True}
        async with aiohttp.ClientSession() as s:
            task = asyncio.create_task(stream_text(s, f"{c.url}/v1/completions", body))
            await asyncio.sleep(0.6)
            c.proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            with pytest.raises((aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, AssertionError)):
                await asyncio.wait_for(task, 15)
        assert c.proc.wait(15) == 0
        assert time.monotonic() - t0 < 6
        assert "connection(s) still busy were cut" in c.log_text()
    finally:
        c.stop()
        eng.stop()
