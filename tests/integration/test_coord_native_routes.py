"""Seed 003's client routes through the coordinator: pass-through with routing, SGLang P/D for
/generate, /v1/models/{id} from the table, and a 501 naming a route no engine serves."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest
import pytest_asyncio
from nats.js import JetStreamContext

from streams.publisher import Publisher
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

GENERATE = {"text": "Tell me about rivers.", "sampling_params": {"max_new_tokens": 9, "temperature": 0}}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engines(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Engine]]:
    tmp = tmp_path_factory.mktemp("native-eng")
    started: dict[str, Engine] = {}
    try:
        alias = ("--served-model-name", "vllm-model", "--served-model-name", "pd-model")
        started["union"] = await start_engine(tmp, "union", "--fast", *alias)
        started["prefill"] = await start_engine(tmp, "prefill", "--fast", *alias, bootstrap=True)
        started["decode"] = await start_engine(tmp, "decode", "--fast", *alias)
        yield started
    finally:
        for e in started.values():
            e.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def coord(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> AsyncIterator[Coordinator]:
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        yield c
    finally:
        c.stop()


async def sse_texts(s: aiohttp.ClientSession, url: str, body: dict[str, object]) -> list[bytes]:
    async with s.post(url, data=orjson.dumps(body)) as r:
        assert r.status == 200, await r.text()
        raw = await r.read()
    return [e[6:] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]


async def test_union_passes_native_routes_through(
    coord: Coordinator, js: JetStreamContext, engines: dict[str, Engine]
) -> None:
    union = engines["union"]
    await Cluster(Publisher(js)).add(union)
    await wait_routable(coord)
    async with aiohttp.ClientSession() as s:
        st, direct, _ = await post(s, f"{union.url}/generate", GENERATE)
        st2, via, headers = await post(s, f"{coord.url}/generate", GENERATE, {"X-Request-Id": "gen-1"})
        assert (st, st2) == (200, 200) and via["text"] == direct["text"]
        assert headers["x-request-id"] == "gen-1" and via["meta_info"]["completion_tokens"] == 9

        events = await sse_texts(s, f"{coord.url}/generate", {**GENERATE, "stream": True})
        assert events[-1] == b"[DONE]" and orjson.loads(events[-2])["text"] == direct["text"]

        st, tok, _ = await post(s, f"{coord.url}/tokenize", {"model": MODEL, "prompt": "rivers run"})
        assert st == 200 and tok["count"] == len(tok["tokens"])
        st, detok, _ = await post(s, f"{coord.url}/detokenize", {"model": MODEL, "tokens": tok["tokens"]})
        assert st == 200 and detok == {"prompt": "rivers run"}

        score = {"model": MODEL, "text_1": "rivers", "text_2": ["water", "stone"]}
        st, via_score, _ = await post(s, f"{coord.url}/v1/score", score)
        _, direct_score, _ = await post(s, f"{union.url}/v1/score", score)
        assert st == 200 and via_score["data"] == direct_score["data"]
        rerank = {"model": MODEL, "query": "rivers", "documents": ["a", "b", "c"], "top_n": 2}
        st, rr, _ = await post(s, f"{coord.url}/v1/rerank", rerank)
        assert st == 200 and len(rr["results"]) == 2

        async with s.get(f"{coord.url}/v1/models/{MODEL}") as r:
            assert r.status == 200 and (await r.json())["id"] == MODEL
        async with s.get(f"{coord.url}/v1/models/nope") as r:
            err = await r.json()
            assert r.status == 404 and err["error"]["code"] == "model_not_found"
        async with s.get(f"{coord.url}/generate") as r:
            assert r.status == 405
        st, err, _ = await post(s, f"{coord.url}/tokenize", {"model": "nope", "prompt": "x"})
        assert st == 404 and err["error"]["code"] == "model_not_found"


async def test_a_route_no_engine_serves_is_a_501_naming_it(
    coord: Coordinator, js: JetStreamContext, engines: dict[str, Engine]
) -> None:
    # The builtin process stands in for a vLLM engine: vLLM serves /tokenize, not /generate.
    await Cluster(Publisher(js)).add(engines["union"], engine_type="vllm", model="vllm-model")
    await wait_routable(coord, {"model": "vllm-model", "prompt": "ping", "max_tokens": 1})
    async with aiohttp.ClientSession() as s:
        st, err, _ = await post(s, f"{coord.url}/generate", {**GENERATE, "model": "vllm-model"})
        assert st == 501 and err["error"]["code"] == "route_not_supported"
        assert "/generate is not served" in err["error"]["message"] and "vllm" in err["error"]["message"]
        st, tok, _ = await post(s, f"{coord.url}/tokenize", {"model": "vllm-model", "prompt": "hi there"})
        assert st == 200 and tok["count"] == 2


async def test_generate_runs_sglang_bootstrap_over_a_pd_pair(
    coord: Coordinator, js: JetStreamContext, engines: dict[str, Engine]
) -> None:
    cluster = Cluster(Publisher(js))
    for role in ("prefill", "decode"):
        await cluster.add(engines[role], engine_type="sglang", capabilities=["bootstrap"], model="pd-model")
    await wait_routable(coord, {"model": "pd-model", "prompt": "ping", "max_tokens": 1})
    async with aiohttp.ClientSession() as s:
        _, direct, _ = await post(s, f"{engines['union'].url}/generate", GENERATE)
        before = await prompt_tokens(s, engines["prefill"])
        st, via, _ = await post(s, f"{coord.url}/generate", {**GENERATE, "model": "pd-model"})
        assert st == 200 and via["text"] == direct["text"]  # prefill computed, decode answered
        assert await prompt_tokens(s, engines["prefill"]) > before  # the prefill leg ran


async def prompt_tokens(s: aiohttp.ClientSession, eng: Engine) -> float:
    async with s.get(f"{eng.url}/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:prompt_tokens")
    )


async def test_native_route_obeys_the_request_timeout(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    slow = await start_engine(tmp_path, "union", "--fast", "--slow-tokens-ms", "300")
    c = await start_coordinator(tmp_path, nats_server.url, request_timeout=1.0)
    try:
        await Cluster(Publisher(js)).add(slow)
        await wait_routable(c)
        async with aiohttp.ClientSession() as s:
            body = {"text": "slow", "sampling_params": {"max_new_tokens": 40}}
            st, err, _ = await post(s, f"{c.url}/generate", body)
            assert st == 504 and err["error"]["code"] == "request_timeout"
    finally:
        c.stop()
        slow.stop()
