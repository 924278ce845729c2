"""Resilience through the coordinator with real engine processes: retry before the first byte,
circuit breaker, first-token timeout, mid-stream continuation, client disconnect, rate limit.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import orjson
from nats.aio.client import Client
from nats.js import JetStreamContext

from streams.publisher import Publisher
from streams.reader import read_range
from streams.server import EmbeddedNats
from tests.integration.coord_harness import (
    MODEL,
    Cluster,
    assert_stream_survives_death,
    free_port,
    post,
    start_coordinator,
    start_engine,
    wait_routable,
)

COMP = {"model": MODEL, "prompt": "A short note", "max_tokens": 4}


async def metric(s: aiohttp.ClientSession, url: str, name: str, label: str = "") -> float:
    async with s.get(f"{url}/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and label in line and not line.startswith("#")
    )


async def test_retry_and_breaker_skip_a_failing_engine(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    good = await start_engine(tmp_path, "union", "--fast")
    bad = await start_engine(tmp_path, "union", "--fast", "--error-rate", "1.0")
    dead = SimpleNamespace(port=free_port(), role="union", bootstrap_port=None)  # nobody listens
    c = await start_coordinator(
        tmp_path,
        nats_server.url,
        retries=3,
        breaker={"failures": 2, "backoff_initial": 60, "backoff_max": 120},
        policy={"union": "round_robin"},
    )
    try:
        cluster = Cluster(Publisher(js))
        for e in (good, bad, dead):
            await cluster.add(e)  # type: ignore[arg-type]
        await wait_routable(c)
        async with aiohttp.ClientSession() as s:
            for _ in range(12):
                st, body, _ = await post(s, f"{c.url}/v1/completions", COMP)
                assert st == 200, body
        log = c.log_text()
        assert f"circuit of n{bad.port}/0 opened" in log
        assert f"circuit of n{dead.port}/0 opened" in log
    finally:
        c.stop()
        good.stop()
        bad.stop()


async def test_first_token_timeout_retries_elsewhere(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    slow = await start_engine(tmp_path, "union", "--ttft-base-ms", "4000")
    fast = await start_engine(tmp_path, "union", "--fast")
    c = await start_coordinator(
        tmp_path, nats_server.url, first_token_timeout=0.5, policy={"union": "round_robin"}
    )
    try:
        cluster = Cluster(Publisher(js))
        await cluster.add(slow)
        await cluster.add(fast)
        await wait_routable(c)
        async with aiohttp.ClientSession() as s:
            for _ in range(4):
                t0 = time.monotonic()
                st, body, _ = await post(s, f"{c.url}/v1/completions", COMP)
                assert st == 200, body
                assert time.monotonic() - t0 < 3.5
        assert "first-token timeout" in c.log_text()
    finally:
        c.stop()
        slow.stop()
        fast.stop()


async def test_decode_death_mid_stream_is_continued(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    dying = await start_engine(tmp_path, "union", "--fast", "--die-mid-stream", "5")
    healthy = await start_engine(tmp_path, "union", "--fast")
    c = await start_coordinator(tmp_path, nats_server.url, policy={"union": "round_robin"})
    try:
        cluster = Cluster(Publisher(js))
        await cluster.add(dying)
        await cluster.add(healthy)
        await wait_routable(c)
        # The stream that killed it still reached the client whole.
        body = {**COMP, "prompt": "Write a long story", "max_tokens": 20, "stream": True}
        await assert_stream_survives_death(c, dying, body)
    finally:
        c.stop()
        dying.stop()
        healthy.stop()


async def test_client_disconnect_aborts_the_engine_request(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    eng = await start_engine(tmp_path, "union", "--fast", "--slow-tokens-ms", "40")
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        await Cluster(Publisher(js)).add(eng)
        await wait_routable(c, {**COMP, "max_tokens": 1})
        reader, writer = await asyncio.open_connection("127.0.0.1", c.port)
        body = orjson.dumps({**COMP, "max_tokens": 400, "stream": True})
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
        )
        got = b""
        while got.count(b"data:") < 3:
            got += await asyncio.wait_for(reader.read(4096), 10)
        async with aiohttp.ClientSession() as s:
            assert await metric(s, eng.url, "vllm:num_requests_running") == 1
            writer.close()
            # Without the abort the engine would stream for 400 × 40 ms = 16 s.
            deadline = time.monotonic() + 5
            while await metric(s, eng.url, "vllm:num_requests_running") != 0:
                assert time.monotonic() < deadline, "engine kept generating for a gone client"
                await asyncio.sleep(0.05)
            assert await metric(s, eng.url, "vllm:request_success_total", 'finished_reason="abort"') == 1
    finally:
        c.stop()
        eng.stop()


async def test_rate_limit_answers_429_with_retry_after(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    eng = await start_engine(tmp_path, "union", "--fast")
    c = await start_coordinator(
        tmp_path, nats_server.url, rate_limit={"requests_per_second": 0.2, "burst": 1}
    )
    try:
        await Cluster(Publisher(js)).add(eng)
        async with aiohttp.ClientSession() as s:
            # The first admitted request spends the burst; it may be a 404/503 while folding.
            for _ in range(200):
                st, body, h = await post(s, f"{c.url}/v1/completions", COMP)
                if st == 429:
                    break
                await asyncio.sleep(0.05)
            assert st == 429
            assert body["error"]["code"] == "rate_limit_exceeded"
            assert 1 <= int(h["retry-after"]) <= 5
    finally:
        c.stop()
        eng.stop()


async def test_sse_stream_passes_through_chunk_by_chunk(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    eng = await start_engine(tmp_path, "union", "--fast", "--slow-tokens-ms", "100")
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        await Cluster(Publisher(js)).add(eng)
        await wait_routable(c, {**COMP, "max_tokens": 1})
        arrivals: list[float] = []
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                f"{c.url}/v1/completions", data=orjson.dumps({**COMP, "max_tokens": 5, "stream": True})
            ) as r,
        ):
            async for _ in r.content.iter_any():
                arrivals.append(time.monotonic())
        # Tokens 100 ms apart arrive apart: nothing buffers the stream.
        assert len(arrivals) >= 4
        assert arrivals[-1] - arrivals[0] >= 0.3
    finally:
        c.stop()
        eng.stop()


async def test_precision_detector_raises_alarm_and_isolates(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, nc: Client
) -> None:
    garbage = await start_engine(tmp_path, "union", "--fast", "--precision-fault")
    c = await start_coordinator(
        tmp_path, nats_server.url, precision_detector={"enabled": True, "sample_rate": 1.0}
    )
    try:
        iid = await Cluster(Publisher(js)).add(garbage)
        body = {**COMP, "max_tokens": 40}
        async with aiohttp.ClientSession() as s:
            await wait_routable(c, body)
            alarms: list[Any] = []
            deadline = time.monotonic() + 15
            while not alarms:
                assert time.monotonic() < deadline, "no precision alarm was appended"
                alarms = [r.event async for r in read_range(nc) if r.event.type == "precision.alarm_raised"]
                await asyncio.sleep(0.1)
            assert alarms[0].data.d_instance_id == iid
            assert alarms[0].data.detector == "coordinator"
            # The alarmed instance leaves routing: nothing else serves the model now.
            deadline = time.monotonic() + 15
            while True:
                st, err, _ = await post(s, f"{c.url}/v1/completions", body)
                if st == 503:
                    break
                assert time.monotonic() < deadline, "alarmed instance still routed"
                await asyncio.sleep(0.1)
            assert "precision alarm" in err["error"]["message"]
    finally:
        c.stop()
        garbage.stop()


async def test_management_api_on_the_same_port(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    eng = await start_engine(tmp_path, "union", "--fast")
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        await Cluster(Publisher(js)).add(eng)
        await wait_routable(c)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{c.url}/readiness") as r:
                assert r.status == 200
            async with s.get(f"{c.url}/v1/instances") as r:
                assert r.status == 200
                listed = orjson.dumps(await r.json())
            assert f"n{eng.port}/0".encode() in listed
            async with s.get(f"{c.url}/metrics") as r:
                text = await r.text()
            assert 'motor_coordinator_requests_total{route="completions",status="200"}' in text
    finally:
        c.stop()
        eng.stop()


async def test_request_timeout_answers_504(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    eng = await start_engine(tmp_path, "union", "--fast", "--slow-tokens-ms", "400")
    c = await start_coordinator(tmp_path, nats_server.url, request_timeout=1.0, first_token_timeout=30)
    try:
        await Cluster(Publisher(js)).add(eng)
        await wait_routable(c, {**COMP, "max_tokens": 1})
        async with aiohttp.ClientSession() as s:
            t0 = time.monotonic()
            st, err, _ = await post(s, f"{c.url}/v1/completions", {**COMP, "max_tokens": 20})
            took = time.monotonic() - t0
            assert st == 504, err
            assert err["error"]["code"] == "request_timeout"
            assert 0.9 <= took < 5
            # The engine saw its client (the coordinator) go away and stopped.
            deadline = time.monotonic() + 5
            while await metric(s, eng.url, "vllm:num_requests_running") != 0:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
    finally:
        c.stop()
        eng.stop()


async def test_engine_restart_on_same_port_is_no_failure(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    eng = await start_engine(tmp_path, "union", "--fast")
    c = await start_coordinator(tmp_path, nats_server.url, retries=0)
    try:
        await Cluster(Publisher(js)).add(eng)
        await wait_routable(c)
        async with aiohttp.ClientSession() as s:
            for _ in range(3):  # fill the coordinator's keep-alive pool
                st, _, _ = await post(s, f"{c.url}/v1/completions", COMP)
                assert st == 200
            eng.stop()
            eng = await start_engine(tmp_path, "union", "--fast", port=eng.port)
            # Pooled connections to the old process are dead; with no retries allowed the
            # request still succeeds: a dead pooled connection is replaced, not counted.
            for _ in range(3):
                st, body, _ = await post(s, f"{c.url}/v1/completions", COMP)
                assert st == 200, body
        assert "retrying elsewhere" not in c.log_text()
    finally:
        c.stop()
        eng.stop()
