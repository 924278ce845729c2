"""No request waits on a hung engine (issue 20 item 1), with real engine processes frozen by
SIGSTOP: an endpoint that leaves routing (its node agent calls it ABNORMAL, a circuit opens on
another request's failure) ends every exchange on it at once, so a request that had sent its
client nothing goes on elsewhere and a stream continues as after a kill; and a request whose
first byte is late is hedged on another path before any health check, the first answer the
client's and the other aborted."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from nats.js import JetStreamContext

from core.events import EndpointStatus
from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.integration.coord_harness import (
    MODEL,
    Cluster,
    Coordinator,
    Engine,
    start_coordinator,
    start_engine,
    wait_routable,
)
from tests.integration.test_coord_proxy_resilience import metric

PROMPTS = ("Tell me about hung engines", "Why do requests need a hedge", "What is a log", "Say more")


def client(c: Coordinator) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{c.url}/v1", api_key="none", max_retries=0, timeout=20)


async def ask(c: Coordinator, prompt: str, *, stream: bool, max_tokens: int = 12) -> tuple[str, float]:
    """(text, seconds) of one completion through the coordinator."""
    t0 = time.monotonic()
    cl = client(c)
    try:
        if stream:
            text = ""
            out = await cl.completions.create(
                model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True
            )
            async for chunk in out:
                text += chunk.choices[0].text or ""
        else:
            resp = await cl.completions.create(
                model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0
            )
            text = resp.choices[0].text
    finally:
        await cl.close()
    return text, time.monotonic() - t0


def freeze(e: Engine) -> None:
    os.kill(e.proc.pid, signal.SIGSTOP)


def thaw(e: Engine) -> None:
    os.kill(e.proc.pid, signal.SIGCONT)


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[tuple[Engine, Engine]]:
    a = await start_engine(tmp_path, "union", "--fast")
    b = await start_engine(tmp_path, "union", "--fast")
    try:
        yield a, b
    finally:
        for e in (a, b):
            thaw(e)
            e.stop()


async def references(c: Coordinator, stream: bool, max_tokens: int = 12) -> dict[str, str]:
    return {p: (await ask(c, p, stream=stream, max_tokens=max_tokens))[0] for p in PROMPTS}


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_requests_on_an_endpoint_that_leaves_routing_go_on_at_once(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, pair: tuple[Engine, Engine], stream: bool
) -> None:
    hung, good = pair
    c = await start_coordinator(
        tmp_path,
        nats_server.url,
        first_token_timeout=30,
        hedge={"enabled": False},
        policy={"union": "round_robin"},
    )
    try:
        cluster = Cluster(Publisher(js))
        iid = await cluster.add(hung)
        await cluster.add(good)
        await wait_routable(c)
        refs = await references(c, stream)
        freeze(hung)
        t0 = time.monotonic()
        asks = [asyncio.create_task(ask(c, p, stream=stream)) for p in PROMPTS]
        await asyncio.sleep(1.0)  # round robin put half of them on the hung engine
        assert not all(t.done() for t in asks), "no request went to the hung engine"
        await cluster.status(hung, iid, EndpointStatus.ABNORMAL, EndpointStatus.READY)  # its node agent
        got = await asyncio.wait_for(asyncio.gather(*asks), 10)
        # Without the move they would wait out the 30 s first-token timeout.
        assert time.monotonic() - t0 < 4.0, [s for _, s in got]
        assert [t for t, _ in got] == [refs[p] for p in PROMPTS]
        async with aiohttp.ClientSession() as s:
            assert await metric(s, c.url, "motor_coordinator_moved_total") >= 1
        assert f"n{hung.port}/0 left routing" in c.log_text()
    finally:
        c.stop()


async def test_a_stream_on_an_endpoint_that_leaves_routing_continues_elsewhere(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    hung = await start_engine(tmp_path, "union", "--fast", "--slow-tokens-ms", "100")
    good = await start_engine(tmp_path, "union", "--fast")
    c = await start_coordinator(
        tmp_path,
        nats_server.url,
        inter_token_timeout=30,
        hedge={"enabled": False},
        policy={"union": "round_robin"},
    )
    try:
        cluster = Cluster(Publisher(js))
        iid = await cluster.add(hung)
        await cluster.add(good)
        await wait_routable(c)
        prompt = "A long stream that will outlive its engine"
        ref, _ = await ask(c, prompt, stream=True, max_tokens=30)
        # The next request goes to the slow one (round robin after the reference's turn):
        # stream from it, then freeze it mid-stream.
        for _ in range(2):
            task = asyncio.create_task(ask(c, prompt, stream=True, max_tokens=30))
            await asyncio.sleep(0.6)
            if not task.done():
                break
            await task
        else:
            raise AssertionError("no stream went to the slow engine")
        freeze(hung)
        t0 = time.monotonic()
        await asyncio.sleep(0.5)
        await cluster.status(hung, iid, EndpointStatus.ABNORMAL, EndpointStatus.READY)
        text, _ = await asyncio.wait_for(task, 10)
        assert time.monotonic() - t0 < 3.0  # not the 30 s inter-token timeout
        assert text == ref
        assert "continuing elsewhere" in c.log_text()
    finally:
        c.stop()
        for e in (hung, good):
            thaw(e)
            e.stop()


async def test_an_opened_circuit_moves_the_other_requests_on_its_endpoint(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, pair: tuple[Engine, Engine]
) -> None:
    hung, good = pair
    c = await start_coordinator(
        tmp_path,
        nats_server.url,
        first_token_timeout=1.5,
        hedge={"enabled": False},
        breaker={"failures": 1, "backoff_initial": 60, "backoff_max": 60},
        policy={"union": "round_robin"},
    )
    try:
        cluster = Cluster(Publisher(js))
        await cluster.add(hung)
        await cluster.add(good)
        await wait_routable(c)
        freeze(hung)
        # Of two requests one goes to the hung engine (round robin): it times out after 1.5 s
        # and opens the circuit. Of two sent 0.7 s later one goes there too: it must move when
        # the circuit opens, not wait out a first-token timeout of its own.
        first = [asyncio.create_task(ask(c, p, stream=False)) for p in PROMPTS[:2]]
        await asyncio.sleep(0.7)
        later = [asyncio.create_task(ask(c, p, stream=True)) for p in PROMPTS[2:]]
        firsts = await asyncio.wait_for(asyncio.gather(*first), 15)
        laters = await asyncio.wait_for(asyncio.gather(*later), 15)
        assert max(s for _, s in firsts) >= 1.5  # one met the hung engine
        assert max(s for _, s in laters) < 1.5, [s for _, s in laters]  # ~0.8 s: moved with the circuit
        log = c.log_text()
        assert f"circuit of n{hung.port}/0 opened" in log
        assert "left routing (its circuit opened" in log
    finally:
        c.stop()


async def test_a_late_first_byte_is_hedged_before_any_health_check(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, pair: tuple[Engine, Engine]
) -> None:
    hung, good = pair
    c = await start_coordinator(
        tmp_path,
        nats_server.url,
        first_token_timeout=30,
        hedge={"min_delay": 0.3},
        policy={"union": "round_robin"},
    )
    try:
        cluster = Cluster(Publisher(js))
        await cluster.add(hung)
        await cluster.add(good)
        await wait_routable(c)
        refs = {s: await references(c, s) for s in (True, False)}
        freeze(hung)  # nobody tells routing: only the hedge can save its requests
        for stream in (True, False):
            got = await asyncio.wait_for(asyncio.gather(*(ask(c, p, stream=stream) for p in PROMPTS[:2])), 15)
            assert [t for t, _ in got] == [refs[stream][p] for p in PROMPTS[:2]]
            assert max(s for _, s in got) < 2.0, [s for _, s in got]
        async with aiohttp.ClientSession() as s:
            assert await metric(s, c.url, "motor_coordinator_hedges_total", 'winner="hedge"') >= 1
        assert "hedged as" in c.log_text()
    finally:
        c.stop()


async def test_the_first_answer_wins_and_the_hedge_is_aborted(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    # Prefill at 40 tokens/s: the one-token ping that warms it up answers at once, the long
    # prompt below after ~1 s, so it is hedged (after 0.3 s) and still answers first.
    slow = await start_engine(tmp_path, "union", "--prefill-tokens-per-s", "40", "--itl-ms", "1")
    other = await start_engine(tmp_path, "union", "--ttft-base-ms", "4000", "--itl-ms", "1")
    c = await start_coordinator(
        tmp_path, nats_server.url, first_token_timeout=30, hedge={"min_delay": 0.3, "factor": 1.0}
    )
    try:
        cluster = Cluster(Publisher(js))
        await cluster.add(slow)
        await wait_routable(c)
        iid = await cluster.add(other)
        await cluster.load(other, iid, running=5)  # least_load sends the request to `slow`
        await wait_until_routes_both(c)
        text, took = await ask(c, "a long prompt " * 14, stream=True)
        assert text and took < 3.5
        async with aiohttp.ClientSession() as s:
            assert await metric(s, c.url, "motor_coordinator_hedges_total", 'winner="first"') == 1
            # The losing hedge's engine request was aborted, not left generating.
            deadline = time.monotonic() + 5
            while await metric(s, other.url, "vllm:num_requests_running") != 0:
                assert time.monotonic() < deadline, "a hedge that lost kept its engine busy"
                await asyncio.sleep(0.05)
            assert await metric(s, other.url, "vllm:request_success_total", 'finished_reason="abort"') == 1
    finally:
        c.stop()
        slow.stop()
        other.stop()


async def wait_until_routes_both(c: Coordinator, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            async with s.get(f"{c.url}/v1/instances") as r:
                body: dict[str, Any] = await r.json()
            rows = body["data"]
            if sum(1 for row in rows if isinstance(row, dict) and row.get("routable")) >= 2:
                return
            await asyncio.sleep(0.05)
    raise TimeoutError("the coordinator never routed to both engines")


async def running_on(s: aiohttp.ClientSession, e: Engine) -> float:
    return await metric(s, e.url, "vllm:num_requests_running")


@pytest.mark.parametrize("frozen", ["prefill", "decode"])
async def test_a_pd_leg_that_leaves_routing_aborts_the_other_leg_at_once(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, frozen: str
) -> None:
    """SGLang's bootstrap runs both legs at once: a decode waits for KV a frozen prefill never
    sends, a prefill computes KV for a frozen decode. When one leg's endpoint leaves routing
    the other leg's engine request is aborted at once and the request goes on elsewhere."""
    prefill = await start_engine(tmp_path, "prefill", "--itl-ms", "1", bootstrap=True)
    decode = await start_engine(tmp_path, "decode", "--itl-ms", "1")
    union = await start_engine(tmp_path, "union", "--fast")
    c = await start_coordinator(tmp_path, nats_server.url, first_token_timeout=30, hedge={"enabled": False})
    try:
        cluster = Cluster(Publisher(js))
        ids = {}
        for name, e in (("prefill", prefill), ("decode", decode)):
            ids[name] = await cluster.add(e, engine_type="sglang", capabilities=("bootstrap",))
        await wait_routable(c)
        uid = await cluster.add(union, engine_type="sglang")
        await cluster.load(union, uid, running=50)  # the pair is the lighter path: it is chosen
        await wait_until_routes_both(c)
        hung, other = (prefill, decode) if frozen == "prefill" else (decode, prefill)
        freeze(hung)
        t0 = time.monotonic()
        task = asyncio.create_task(ask(c, "A question for a frozen pair", stream=True, max_tokens=200))
        async with aiohttp.ClientSession() as s:
            await asyncio.sleep(0.5)  # both legs are out: one on the frozen engine
            await cluster.status(hung, ids[frozen], EndpointStatus.ABNORMAL, EndpointStatus.READY)
            text, _ = await asyncio.wait_for(task, 10)
            assert text and time.monotonic() - t0 < 4.0  # not the 30 s first-token timeout
            # The peer leg's engine request was aborted, not left waiting or computing.
            deadline = time.monotonic() + 2
            while await metric(s, other.url, "vllm:request_success_total", 'finished_reason="abort"') < 1:
                assert time.monotonic() < deadline, f"the frozen {frozen}'s peer kept its request"
                await asyncio.sleep(0.02)
            assert await running_on(s, other) == 0
        assert f"n{hung.port}/0 left routing" in c.log_text()
    finally:
        c.stop()
        for e in (prefill, decode, union):
            thaw(e)
            e.stop()
