"""The whole fleet serves and survives: union and P/D paths compete, an engine killed (kill -9)
or frozen (SIGSTOP) mid-stream or before its first byte costs no client anything, a restarted
engine is routed at once, and the log says what the coordinator decided — all with real
builtin engine processes behind a real coordinator, the OpenAI and Anthropic SDKs as clients.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
import pytest_asyncio
from nats.aio.client import Client
from nats.js import JetStreamContext

from coordinator.anthropic import messages_to_chat
from core.events import EndpointStatus
from streams.definitions import MOTOR_STREAM
from streams.publisher import Publisher
from streams.reader import read_range
from streams.server import EmbeddedNats
from tests.integration.coord_harness import (
    MODEL,
    Cluster,
    Coordinator,
    Engine,
    post,
    start_coordinator,
    start_engine,
    wait_routable,
)
from tests.integration.test_replay_cli import motor

BUSY = 100  # a heartbeat's running count that makes a path lose every load comparison


async def finished(s: aiohttp.ClientSession, eng: Engine) -> float:
    """Requests the engine finished, from its vLLM-named counter."""
    return await engine_metric(s, eng, "vllm:request_success_total")


async def engine_metric(s: aiohttp.ClientSession, eng: Engine, name: str) -> float:
    async with s.get(f"{eng.url}/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
        text = await r.text()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


async def coord_metric(s: aiohttp.ClientSession, c: Coordinator, name: str, label: str = "") -> float:
    async with s.get(f"{c.url}/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and label in line and not line.startswith("#")
    )


def sdk(c: Coordinator) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{c.url}/v1", api_key="none", max_retries=0, timeout=60)


async def direct_chat(eng: Engine, messages: list[dict[str, Any]], max_tokens: int, **sampling: Any) -> str:
    """The undisturbed answer, from a healthy union engine directly (builtin text is deterministic)."""
    async with aiohttp.ClientSession() as s:
        body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, **sampling}
        body = {k: v for k, v in body.items() if v is not None}  # None: the engine's default
        st, data, _ = await post(s, f"{eng.url}/v1/chat/completions", body)
    assert st == 200, data
    text: str = data["choices"][0]["message"]["content"]
    return text


async def direct_completion(eng: Engine, prompt: str, max_tokens: int) -> str:
    async with aiohttp.ClientSession() as s:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        st, data, _ = await post(s, f"{eng.url}/v1/completions", body)
    assert st == 200, data
    text: str = data["choices"][0]["text"]
    return text


async def wait_log(c: Coordinator, text: str, within: float = 30.0) -> None:
    """Poll the coordinator's log for `text` (its own log line: nothing to await)."""
    deadline = time.monotonic() + within
    while text not in c.log_text():
        assert time.monotonic() < deadline, f"{text!r} never appeared in the coordinator's log"
        await asyncio.sleep(0.05)


def freeze(eng: Engine) -> None:
    os.kill(eng.proc.pid, signal.SIGSTOP)


def thaw(eng: Engine) -> None:
    if eng.alive():
        os.kill(eng.proc.pid, signal.SIGCONT)


@pytest.fixture
def owned() -> Iterator[list[Engine | Coordinator]]:
    """Processes a test starts; each is stopped afterwards (thawed first), whatever happened."""
    made: list[Engine | Coordinator] = []
    try:
        yield made
    finally:
        for proc in reversed(made):
            if isinstance(proc, Engine):
                thaw(proc)
            proc.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def healthy(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Engine]]:
    """A union engine, a prefill and a decode that never fail (each test registers what it needs)."""
    tmp = tmp_path_factory.mktemp("fleet")
    started: dict[str, Engine] = {}
    try:
        started["union"] = await start_engine(tmp, "union", "--fast")
        started["prefill"] = await start_engine(tmp, "prefill", "--fast")
        started["decode"] = await start_engine(tmp, "decode", "--fast")
        yield started
    finally:
        for e in started.values():
            e.stop()


HANDOFF = {"engine_type": "vllm", "capabilities": ["handoff"]}


# --------------------------------------------------------------------------- the whole fleet


async def test_union_serves_beside_a_pd_pair(
    tmp_path: Path,
    nats_server: EmbeddedNats,
    js: JetStreamContext,
    healthy: dict[str, Engine],
    owned: list[Engine | Coordinator],
) -> None:
    """Regression: the union instance never served while a P/D pair existed (load stayed 0/0)."""
    c = await start_coordinator(tmp_path, nats_server.url)
    owned.append(c)
    try:
        cluster = Cluster(Publisher(js))
        await cluster.add(healthy["union"], **HANDOFF)
        await cluster.add(healthy["prefill"], **HANDOFF)
        await cluster.add(healthy["decode"], **HANDOFF)
        await wait_routable(c)
        async with aiohttp.ClientSession() as s:
            before_u = await finished(s, healthy["union"])
            before_d = await finished(s, healthy["decode"])
            client = sdk(c)
            try:
                answers = await asyncio.gather(
                    *(
                        client.chat.completions.create(
                            model=MODEL,
                            messages=[{"role": "user", "content": f"Question {i}"}],
                            max_tokens=8,
                            temperature=0,
                        )
                        for i in range(12)
                    )
                )
            finally:
                await client.close()
            assert all(a.choices[0].message.content for a in answers)
            union = await finished(s, healthy["union"]) - before_u
            decode = await finished(s, healthy["decode"]) - before_d
        assert union >= 3 and decode >= 3, f"union served {union}, the pair {decode}: capacity idled"
    finally:
        c.stop()


# --------------------------------------------------------------------------- kill -9 the decode


async def test_decode_kill9_under_16_streams_continues_on_union_and_resumes_on_restart(
    tmp_path: Path,
    nats_server: EmbeddedNats,
    nc: Client,
    js: JetStreamContext,
    healthy: dict[str, Engine],
    owned: list[Engine | Coordinator],
) -> None:
    """Regression: kill -9 of the decode under 16 P/D streams ended all 16 with `no routable
    prefill/decode pair left` although the union was idle; then every request got 503 for the
    circuit's whole backoff although the decode was back READY as a new process."""
    decode = await start_engine(tmp_path, "decode", "--itl-ms", "40")
    owned.append(decode)
    union, prefill = healthy["union"], healthy["prefill"]
    c = await start_coordinator(
        tmp_path, nats_server.url, breaker={"failures": 3, "backoff_initial": 120, "backoff_max": 300}
    )
    owned.append(c)
    client = sdk(c)
    try:
        cluster = Cluster(Publisher(js))
        u_id = await cluster.add(union, **HANDOFF)
        await cluster.add(prefill, **HANDOFF)
        d_id = await cluster.add(decode, **HANDOFF)
        await cluster.load(union, u_id, BUSY)  # every new stream takes the P/D pair
        await wait_routable(c)
        asks = [[{"role": "user", "content": f"Tell story number {i}"}] for i in range(16)]
        want = await asyncio.gather(*(direct_chat(union, m, 40) for m in asks))
        started = [asyncio.Event() for _ in asks]

        async def one(i: int) -> str:
            stream = await client.chat.completions.create(
                model=MODEL,
                messages=asks[i],
                max_tokens=40,
                temperature=0,
                stream=True,  # type: ignore[arg-type]
            )
            parts: list[str] = []
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    parts.append(chunk.choices[0].delta.content)
                    if len(parts) >= 3:
                        started[i].set()
            return "".join(parts)

        async with aiohttp.ClientSession() as s:
            served_by_union = await finished(s, union)
            tasks = [asyncio.create_task(one(i)) for i in range(16)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 30)
            os.kill(decode.proc.pid, signal.SIGKILL)  # all 16 are mid-stream on the pair
            got = await asyncio.wait_for(asyncio.gather(*tasks), 60)
            assert got == want  # every client saw its whole, undisturbed text
            assert await finished(s, union) - served_by_union >= 16
            await wait_log(c, f"circuit of n{decode.port}/0 opened")

            # The node agent's part: DEAD, a new process on the same port, STARTING, READY.
            await cluster.status(decode, d_id, EndpointStatus.DEAD, EndpointStatus.READY)
            decode = await start_engine(tmp_path, "decode", "--fast", port=decode.port)
            owned.append(decode)
            await cluster.status(decode, d_id, EndpointStatus.STARTING, EndpointStatus.DEAD)
            ready_at = time.monotonic()
            await cluster.status(decode, d_id, EndpointStatus.READY, EndpointStatus.STARTING)
            # Routing resumes on it at once (the circuit was the killed process's), long
            # before the 120 s backoff.
            while await finished(s, decode) < 1:
                assert time.monotonic() - ready_at < 10, "the restarted decode was not routed"
                st, body, _ = await post(
                    s, f"{c.url}/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 2}
                )
                assert st == 200, body
        await wait_log(c, f"circuit of n{decode.port}/0 closed: new incarnation (pid {decode.proc.pid})")

        # The log explains what the clients saw: the circuit and the 16 continued streams.
        key = f"n{decode.port}/0"
        deadline = time.monotonic() + 30
        while True:
            recs = [r async for r in read_range(nc, MOTOR_STREAM)]
            mine = [r.event.data for r in recs if r.event.type == "coordinator.streams_disrupted"]
            continued = sum(d.continued for d in mine if d.endpoint == key)
            circuits = [r.event.data for r in recs if r.event.type == "coordinator.circuit_changed"]
            if continued >= 16 and any(d.state == "closed" for d in circuits):
                break
            assert time.monotonic() < deadline, f"fault events never landed: {mine} {circuits}"
            await asyncio.sleep(0.2)
        assert sum(d.broken for d in mine if d.endpoint == key) == 16
        assert sum(d.failed for d in mine if d.endpoint == key) == 0
        assert [d.state for d in circuits if d.endpoint == key] == ["open", "closed"]
        code, text, err = await motor("replay", "--explain", "instance", str(d_id), url=nats_server.url)
        assert code == 0, err
        assert f"circuit of {key} opened" in text and "after 3 failures" in text
        assert f"circuit of {key} closed" in text and "new incarnation" in text
        assert "streams broke" in text and f"continued on n{union.port}/0" in text
        assert "READY → DEAD" in text or "READY -> DEAD" in text
    finally:
        await client.close()
        c.stop()
        decode.stop()


# --------------------------------------------------------------------------- SIGSTOP


async def test_engine_frozen_mid_stream_is_continued_after_the_inter_token_timeout(
    tmp_path: Path,
    nats_server: EmbeddedNats,
    js: JetStreamContext,
    healthy: dict[str, Engine],
    owned: list[Engine | Coordinator],
) -> None:
    """Regression: a stream on an engine that hung (SIGSTOP) mid-stream hung its client."""
    frozen = await start_engine(tmp_path, "union", "--itl-ms", "40")
    owned.append(frozen)
    spare = healthy["union"]
    c = await start_coordinator(tmp_path, nats_server.url, inter_token_timeout=1.0, first_token_timeout=10)
    owned.append(c)
    client = sdk(c)
    try:
        cluster = Cluster(Publisher(js))
        await cluster.add(frozen)
        s_id = await cluster.add(spare)
        await cluster.load(spare, s_id, BUSY)  # the stream starts on the engine that will hang
        await wait_routable(c)
        prompt = "A long walk through the hills"
        want = await direct_completion(spare, prompt, 30)
        stream = await client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=30, temperature=0, stream=True
        )
        parts: list[str] = []
        stopped_at = 0.0
        async for chunk in stream:
            parts.append(chunk.choices[0].text)
            if len(parts) == 3:
                freeze(frozen)
                stopped_at = time.monotonic()
        assert "".join(parts) == want
        assert time.monotonic() - stopped_at < 8  # the 1 s timeout, a sweep, and the rest of the text
        async with aiohttp.ClientSession() as s:
            assert await coord_metric(s, c, "motor_coordinator_upstream_errors_total", 'kind="stall"') == 1
            assert await coord_metric(s, c, "motor_coordinator_continuations_total") == 1
            # The frozen engine's request was aborted: once it runs again it has nothing to do.
            thaw(frozen)
            deadline = time.monotonic() + 10
            while await engine_metric(s, frozen, "vllm:num_requests_running") != 0:
                assert time.monotonic() < deadline, "the stalled request was never aborted"
                await asyncio.sleep(0.1)
        assert f"broke on n{frozen.port}/0 after 3 tokens" in c.log_text()
        assert "inter-token timeout" in c.log_text()
    finally:
        thaw(frozen)
        await client.close()
        c.stop()
        frozen.stop()


async def test_frozen_engines_before_the_first_byte_are_retried_elsewhere(
    tmp_path: Path,
    nats_server: EmbeddedNats,
    js: JetStreamContext,
    healthy: dict[str, Engine],
    owned: list[Engine | Coordinator],
) -> None:
    """A request stuck before its first byte on a SIGSTOPped engine — a union, or the prefill of
    the pair — is served elsewhere once the first-token timeout passes."""
    frozen_union = await start_engine(tmp_path, "union", "--fast")
    owned.append(frozen_union)
    frozen_prefill = await start_engine(tmp_path, "prefill", "--fast")
    owned.append(frozen_prefill)
    c = await start_coordinator(tmp_path, nats_server.url, first_token_timeout=1.0, retries=3)
    owned.append(c)
    client = sdk(c)
    try:
        cluster = Cluster(Publisher(js))
        await cluster.add(frozen_union, **HANDOFF)
        await cluster.add(frozen_prefill, **HANDOFF)
        await cluster.add(healthy["decode"], **HANDOFF)
        su = await cluster.add(healthy["union"], **HANDOFF)
        await cluster.load(healthy["union"], su, BUSY)  # the frozen paths are tried first
        await wait_routable(c)
        freeze(frozen_union)
        freeze(frozen_prefill)
        want = await direct_completion(healthy["union"], "frozen", 6)
        for stream in (False, True, False):
            t0 = time.monotonic()
            if stream:
                chunks = await client.completions.create(
                    model=MODEL, prompt="frozen", max_tokens=6, temperature=0, stream=True
                )
                text = "".join([ch.choices[0].text async for ch in chunks])
            else:
                done = await client.completions.create(
                    model=MODEL, prompt="frozen", max_tokens=6, temperature=0
                )
                text = done.choices[0].text
            assert text == want
            assert time.monotonic() - t0 < 6  # two 1 s timeouts at most, then the healthy union
        log = c.log_text()
        assert f"n{frozen_union.port}/0: engine sent no token before the first-token timeout" in log
        assert f"prefill n{frozen_prefill.port}/0: engine sent no token" in log
    finally:
        thaw(frozen_union)
        thaw(frozen_prefill)
        await client.close()
        c.stop()
        frozen_union.stop()
        frozen_prefill.stop()


# --------------------------------------------------------------------------- continuation on any path

QUESTION = "Explain why the sky looks blue at noon"


@pytest.mark.parametrize("api", ["chat", "completions", "anthropic"])
@pytest.mark.parametrize("direction", ["pd_to_union", "union_to_pd"])
async def test_a_stream_continues_on_any_path_with_the_undisturbed_text(
    tmp_path: Path,
    nats_server: EmbeddedNats,
    js: JetStreamContext,
    healthy: dict[str, Engine],
    direction: str,
    api: str,
    owned: list[Engine | Coordinator],
) -> None:
    """An engine dies mid-stream (exit after 4 tokens); the stream goes on on the other kind of
    path and the client's whole text is the undisturbed run's (temperature 0)."""
    dying_role = "decode" if direction == "pd_to_union" else "union"
    dying = await start_engine(tmp_path, dying_role, "--fast", "--die-mid-stream", "4")
    owned.append(dying)
    c = await start_coordinator(tmp_path, nats_server.url)
    owned.append(c)
    try:
        cluster = Cluster(Publisher(js))
        if direction == "pd_to_union":
            u = await cluster.add(healthy["union"], **HANDOFF)
            await cluster.add(healthy["prefill"], **HANDOFF)
            await cluster.add(dying, **HANDOFF)
            await cluster.load(healthy["union"], u, BUSY)
        else:
            await cluster.add(dying, **HANDOFF)
            await cluster.add(healthy["prefill"], **HANDOFF)
            d = await cluster.add(healthy["decode"], **HANDOFF)
            await cluster.load(healthy["decode"], d, BUSY)
        await wait_routable(c, {"model": MODEL, "prompt": "ping", "max_tokens": 1})
        ref = healthy["union"]
        if api == "completions":
            want = await direct_completion(ref, QUESTION, 14)
            oa = sdk(c)
            try:
                stream = await oa.completions.create(
                    model=MODEL, prompt=QUESTION, max_tokens=14, temperature=0, stream=True
                )
                text = "".join([ch.choices[0].text async for ch in stream])
            finally:
                await oa.close()
        elif api == "chat":
            messages = [{"role": "user", "content": QUESTION}]
            want = await direct_chat(ref, messages, 14)
            oa = sdk(c)
            try:
                chat = await oa.chat.completions.create(
                    model=MODEL,
                    messages=messages,
                    max_tokens=14,
                    temperature=0,
                    stream=True,  # type: ignore[arg-type]
                )
                text = "".join([ch.choices[0].delta.content or "" async for ch in chat if ch.choices])
            finally:
                await oa.close()
        else:
            # This SDK's `messages.stream` takes no temperature: the engine's default sampling,
            # deterministic all the same.
            body = {"model": MODEL, "max_tokens": 14, "messages": [{"role": "user", "content": QUESTION}]}
            chat_body = messages_to_chat(body)
            sampling = {k: v for k, v in chat_body.items() if k not in ("model", "messages", "max_tokens")}
            want = await direct_chat(ref, chat_body["messages"], 14, temperature=None, **sampling)
            an = anthropic.AsyncAnthropic(base_url=c.url, api_key="x", max_retries=0)
            try:
                async with an.messages.stream(
                    model=MODEL, max_tokens=14, messages=[{"role": "user", "content": QUESTION}]
                ) as s:
                    text = "".join([t async for t in s.text_stream])
                    final = await s.get_final_message()
                assert final.stop_reason == "max_tokens"
            finally:
                await an.close()
        deadline = time.monotonic() + 10
        while dying.alive():
            assert time.monotonic() < deadline, "the dying engine never served the stream"
            await asyncio.sleep(0.05)
        assert text == want
        assert f"broke on n{dying.port}/0 after 4 tokens" in c.log_text()
    finally:
        c.stop()
        dying.stop()


async def test_a_stream_with_no_path_left_fails_and_the_log_says_so(
    tmp_path: Path,
    nats_server: EmbeddedNats,
    nc: Client,
    js: JetStreamContext,
    owned: list[Engine | Coordinator],
) -> None:
    dying = await start_engine(tmp_path, "union", "--fast", "--die-mid-stream", "3")
    owned.append(dying)
    c = await start_coordinator(tmp_path, nats_server.url)
    owned.append(c)
    try:
        await Cluster(Publisher(js)).add(dying)
        await wait_routable(c, {"model": MODEL, "prompt": "ping", "max_tokens": 1})
        body = {"model": MODEL, "prompt": QUESTION, "max_tokens": 12, "stream": True}
        async with aiohttp.ClientSession() as s, s.post(f"{c.url}/v1/completions", json=body) as r:
            assert r.status == 200  # the head went out before the engine died
            raw = await r.read()
        assert b"no healthy path left for model 'motor-sim'" in raw and b"failed for this request" in raw
        key = f"n{dying.port}/0"
        deadline = time.monotonic() + 30
        while True:
            recs = [r async for r in read_range(nc, MOTOR_STREAM)]
            mine = [r.event.data for r in recs if r.event.type == "coordinator.streams_disrupted"]
            if mine:
                break
            assert time.monotonic() < deadline, "no streams_disrupted event landed"
            await asyncio.sleep(0.2)
        (d,) = mine
        assert (d.endpoint, d.broken, d.continued, d.failed) == (key, 1, 0, 1)
        assert d.reasons == {"transport": 1}
    finally:
        c.stop()
        dying.stop()
