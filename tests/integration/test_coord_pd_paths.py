"""P/D through the coordinator: vLLM handoff and SGLang bootstrap give a direct union
request's text (builtin engines are deterministic), and incompatible pairs fail closed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from nats.js import JetStreamContext

from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.integration.coord_harness import (
    MODEL,
    Cluster,
    Engine,
    assert_stream_survives_death,
    post,
    start_coordinator,
    start_engine,
    stream_text,
    wait_routable,
)

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Explain the tides."}], "max_tokens": 20}
COMP = {"model": MODEL, "prompt": "The history of bridges", "max_tokens": 16}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engines(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Engine]]:
    tmp = tmp_path_factory.mktemp("pd")
    started: dict[str, Engine] = {}
    try:
        started["union"] = await start_engine(tmp, "union", "--fast")
        started["prefill"] = await start_engine(tmp, "prefill", "--fast", bootstrap=True)
        started["decode"] = await start_engine(tmp, "decode", "--fast")
        yield started
    finally:
        for e in started.values():
            e.stop()


async def finished(s: aiohttp.ClientSession, eng: Engine) -> float:
    """Requests the engine finished, from its vLLM-named counter."""
    async with s.get(f"{eng.url}/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


async def finished_at_least(s: aiohttp.ClientSession, eng: Engine, n: float, within: float = 10.0) -> bool:
    """Whether the engine's finished count reaches `n` within `within` seconds."""
    deadline = time.monotonic() + within
    while await finished(s, eng) < n:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def _direct(union: Engine) -> tuple[str, str, str]:
    async with aiohttp.ClientSession() as s:
        _, chat, _ = await post(s, f"{union.url}/v1/chat/completions", CHAT)
        _, comp, _ = await post(s, f"{union.url}/v1/completions", COMP)
        stream, _ = await stream_text(s, f"{union.url}/v1/chat/completions", {**CHAT, "stream": True})
    return chat["choices"][0]["message"]["content"], comp["choices"][0]["text"], stream


@pytest.mark.parametrize(
    ("engine_type", "capability"),
    [("vllm", "handoff"), ("sglang", "bootstrap")],
)
async def test_pd_matches_direct_union(
    tmp_path: Path,
    nats_server: EmbeddedNats,
    js: JetStreamContext,
    engines: dict[str, Engine],
    engine_type: str,
    capability: str,
) -> None:
    want_chat, want_comp, want_stream = await _direct(engines["union"])
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        cluster = Cluster(Publisher(js))
        await cluster.add(engines["prefill"], engine_type=engine_type, capabilities=[capability])
        await cluster.add(engines["decode"], engine_type=engine_type, capabilities=[capability])
        await wait_routable(c)
        async with aiohttp.ClientSession() as s:
            before_p = await finished(s, engines["prefill"])
            before_d = await finished(s, engines["decode"])
            st, chat, h = await post(s, f"{c.url}/v1/chat/completions", CHAT, {"X-Request-Id": "pd-1"})
            assert st == 200, chat
            assert chat["choices"][0]["message"]["content"] == want_chat
            assert h["x-request-id"] == "pd-1"
            st, comp, _ = await post(s, f"{c.url}/v1/completions", COMP)
            assert st == 200, comp
            assert comp["choices"][0]["text"] == want_comp
            text, chunks = await stream_text(s, f"{c.url}/v1/chat/completions", {**CHAT, "stream": True})
            assert text == want_stream
            assert chunks[-1] == {"done": True}
            # Both legs ran: the prefill engine answered one request per client request. A
            # bootstrap prefill runs beside its decode and may finish after the client's answer.
            assert await finished_at_least(s, engines["prefill"], before_p + 3)
            assert await finished(s, engines["decode"]) >= before_d + 3
            # A request the engines refuse (top_p 0): the prefill's refusal (handoff) or the
            # decode's (bootstrap) is the answer, in the client's API.
            bad = {**CHAT, "top_p": 0}
            st, err, _ = await post(s, f"{c.url}/v1/chat/completions", bad)
            assert st == 400 and err["error"]["type"] == "BadRequestError", err
            st, err, _ = await post(s, f"{c.url}/v1/messages", bad)
            assert st == 400 and err["type"] == "error", err
            assert err["error"]["type"] == "invalid_request_error" and "top_p" in err["error"]["message"]
    finally:
        c.stop()


async def test_incompatible_pairs_fail_closed(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, engines: dict[str, Engine]
) -> None:
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        cluster = Cluster(Publisher(js))
        # Decode first: a lone prefill would be routed as a single hop.
        await cluster.add(engines["decode"], engine_type="sglang", capabilities=["bootstrap"])
        await cluster.add(engines["prefill"], engine_type="vllm", capabilities=["handoff"])
        async with aiohttp.ClientSession() as s:
            for _ in range(400):
                st, err, _ = await post(s, f"{c.url}/v1/completions", COMP)
                assert st in (404, 503), err
                if "no compatible" in err["error"]["message"]:
                    break
                await asyncio.sleep(0.05)
            assert st == 503
            assert err["error"]["code"] == "no_routable_instance"
            assert "no compatible prefill/decode pair" in err["error"]["message"]
    finally:
        c.stop()


async def test_a_pair_speaking_only_a_protocol_without_an_adapter_fails_closed(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, engines: dict[str, Engine]
) -> None:
    # Both halves register `trigger` (a dispatch profile the config knows): the plan pairs
    # them, and the attempt loop refuses the pair rather than send it half a protocol.
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        cluster = Cluster(Publisher(js))
        await cluster.add(engines["decode"], engine_type="vllm", capabilities=["trigger"])
        await cluster.add(engines["prefill"], engine_type="vllm", capabilities=["trigger"])
        async with aiohttp.ClientSession() as s:
            deadline = asyncio.get_running_loop().time() + 30
            while True:
                st, err, _ = await post(s, f"{c.url}/v1/completions", COMP)
                if "has no adapter" in str(err) or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)
        assert st == 503, err
        assert err["error"]["message"] == "P/D protocol 'trigger' has no adapter"
        assert err["error"]["type"] == "service_unavailable"
    finally:
        c.stop()


async def test_decode_death_mid_stream_continues_on_another_pair(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, engines: dict[str, Engine]
) -> None:
    dying = await start_engine(tmp_path, "decode", "--fast", "--die-mid-stream", "4")
    c = await start_coordinator(tmp_path, nats_server.url, policy={"decode": "round_robin"})
    try:
        cluster = Cluster(Publisher(js))
        for e in (engines["prefill"], engines["decode"], dying):
            await cluster.add(e, engine_type="vllm", capabilities=["handoff"])
        await wait_routable(c)
        await assert_stream_survives_death(c, dying, {**COMP, "max_tokens": 12, "stream": True})
    finally:
        c.stop()
        dying.stop()
