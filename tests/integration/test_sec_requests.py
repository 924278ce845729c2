"""Request ids and max_tokens (issue 12, items 4 and 6) through a real coordinator and real
builtin engines: the client's x-request-id is echoed and logged but never reaches an engine
as its request id or bootstrap room; max_tokens over the model's limit is a 400 naming it.
"""

from __future__ import annotations

import asyncio
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
from tests.unit.coord_events import seed_instance

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me about rivers."}], "max_tokens": 8}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engines(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Engine]]:
    tmp = tmp_path_factory.mktemp("eng")
    started: dict[str, Engine] = {}
    try:
        started["union"] = await start_engine(tmp, "union", "--fast")
        started["prefill"] = await start_engine(tmp, "prefill", "--fast", bootstrap=True)
        started["decode"] = await start_engine(tmp, "decode", "--fast")
        yield started
    finally:
        for e in started.values():
            e.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def coord(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, engines: dict[str, Engine]
) -> AsyncIterator[Coordinator]:
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        await Cluster(Publisher(js)).add(engines["union"])
        await wait_routable(c)
        yield c
    finally:
        c.stop()


async def test_the_client_request_id_is_echoed_not_used_by_the_engine(coord: Coordinator) -> None:
    async with aiohttp.ClientSession() as s:
        for body in (CHAT, {**CHAT, "stream": True}):
            async with s.post(
                f"{coord.url}/v1/chat/completions",
                data=orjson.dumps(body),
                headers={"x-request-id": "client-7"},
            ) as r:
                assert r.status == 200
                assert r.headers["x-request-id"] == "client-7"
                text = await r.text()
            assert "client-7" not in text, "the engine's request id came from the client"
        # Without one, the coordinator's own id is what the client gets back.
        st, body, headers = await post(s, f"{coord.url}/v1/chat/completions", CHAT)
        assert st == 200 and headers["x-request-id"] and headers["x-request-id"] in body["id"]
        # An id that does not fit in a header line is not echoed.
        st, body, headers = await post(
            s, f"{coord.url}/v1/chat/completions", CHAT, {"x-request-id": "a" * 300}
        )
        assert st == 200 and headers["x-request-id"] != "a" * 300


async def test_a_client_body_cannot_steer_engine_ids_or_kv_transfers(coord: Coordinator) -> None:
    # Fields only the coordinator may set: the engine's request id, an SGLang bootstrap peer,
    # a vLLM KV source. From a client they would collide requests or send an engine to
    # fetch from a host of the client's choice.
    steer = {
        "rid": "mine",
        "request_id": "mine",
        "bootstrap_host": "10.255.255.1",
        "bootstrap_port": 9,
        "bootstrap_room": 7,
        "kv_transfer_params": {
            "do_remote_prefill": True,
            "remote_engine_id": "x",
            "remote_block_ids": [1],
            "remote_request_id": "mine",
            "remote_host": "10.255.255.1",
            "remote_port": 9,
        },
    }
    async with aiohttp.ClientSession() as s:
        for path, body in (
            ("/v1/chat/completions", {**CHAT, **steer}),
            ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 4, **steer}),
        ):
            results = await asyncio.gather(*(post(s, f"{coord.url}{path}", body) for _ in range(2)))
            assert [st for st, _, _ in results] == [200, 200], results
            assert all("mine" not in b["id"] for _, b, _ in results)


async def test_equal_client_ids_do_not_share_a_bootstrap_room(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, engines: dict[str, Engine]
) -> None:
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        cluster = Cluster(Publisher(js))
        await cluster.add(engines["prefill"], engine_type="sglang", capabilities=["bootstrap"])
        await cluster.add(engines["decode"], engine_type="sglang", capabilities=["bootstrap"])
        await wait_routable(c)
        body = {**CHAT, "max_tokens": 24}
        async with aiohttp.ClientSession() as s:
            for _ in range(3):
                results = await asyncio.gather(
                    *(
                        post(s, f"{c.url}/v1/chat/completions", body, {"x-request-id": "same"})
                        for _ in range(4)
                    )
                )
                assert [st for st, _, _ in results] == [200] * 4, [b for _, b, _ in results]
                assert {h["x-request-id"] for _, _, h in results} == {"same"}
                assert len({b["id"] for _, b, _ in results}) == 4
    finally:
        c.stop()


async def test_a_timed_out_request_is_logged_with_both_ids(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    slow = await start_engine(tmp_path, "union", "--itl-ms", "400")
    c = await start_coordinator(tmp_path, nats_server.url, request_timeout=1.0)
    try:
        await Cluster(Publisher(js)).add(slow)
        await wait_routable(c)
        async with aiohttp.ClientSession() as s:
            st, err, headers = await post(
                s, f"{c.url}/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 30},
                {"x-request-id": "slow-client-1"},
            )  # fmt: skip
        assert st == 504, err
        assert headers["x-request-id"] == "slow-client-1"
        line = next(ln for ln in c.log_text().splitlines() if "slow-client-1" in ln)
        assert "timeout" in line and "request " in line
    finally:
        c.stop()
        slow.stop()


async def test_max_tokens_over_the_model_limit_is_refused_by_the_coordinator(
    coord: Coordinator, engines: dict[str, Engine]
) -> None:
    # The engine (max_model_len 8192) registered with the default capacity, max_seq_len 4096:
    # the coordinator holds the line at what the registration says.
    async with aiohttp.ClientSession() as s:
        for path, body, field in [
            ("/v1/chat/completions", {**CHAT, "max_tokens": 5000}, "max_tokens"),
            ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 10**12}, "max_completion_tokens"),
            ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 4097}, "max_tokens"),
            ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "many"}, "max_tokens"),
            ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ]:
            st, err, _ = await post(s, f"{coord.url}{path}", body)
            assert st == 400, (body, err)
            assert err["error"]["message"].startswith(f"{field}:"), err
            assert err["error"]["code"] == "invalid_max_tokens"
        msg = {"model": MODEL, "max_tokens": 5000, "messages": [{"role": "user", "content": "hi"}]}
        st, err, _ = await post(s, f"{coord.url}/v1/messages", msg)
        assert st == 400 and err["type"] == "error"
        assert err["error"]["message"].startswith("max_tokens:")
        st, _, _ = await post(
            s, f"{coord.url}/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 4}
        )
        assert st == 200


async def test_max_tokens_limit_of_a_refreshed_instance(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, engines: dict[str, Engine]
) -> None:
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        inst = seed_instance(3, 85, 2, port=str(engines["union"].port), model=MODEL)
        async with aiohttp.ClientSession() as s:
            st, _, _ = await post(s, f"{c.url}/v1/instances/refresh", {"ids": [3], "instances": [inst]})
            assert st == 200
            await wait_routable(c)
            # seed_instance says max_seq_len 2048, max_output_len 512: the output bound wins.
            st, err, _ = await post(
                s, f"{c.url}/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 600}
            )
            assert st == 400 and "512" in err["error"]["message"], err
            st, _, _ = await post(
                s, f"{c.url}/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 500}
            )
            assert st == 200
    finally:
        c.stop()


async def test_the_engine_names_the_field_over_its_max_model_len(engines: dict[str, Engine]) -> None:
    url = engines["union"].url
    async with aiohttp.ClientSession() as s:
        for body, field in [
            ({**CHAT, "max_tokens": 10**9}, "max_tokens"),
            ({**CHAT, "max_completion_tokens": 10**9}, "max_completion_tokens"),
        ]:
            st, err, _ = await post(s, f"{url}/v1/chat/completions", body)
            assert st == 400 and err["error"]["param"] == field, err
        st, err, _ = await post(
            s, f"{url}/v1/embeddings", {"model": MODEL, "input": "x", "dimensions": 10**8}
        )
        assert st == 400 and err["error"]["param"] == "dimensions", err
