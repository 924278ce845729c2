"""The coordinator in front of a union engine: same text as a direct request, OpenAI errors,
request ids, API keys, body limit, and the official OpenAI and Anthropic SDKs as clients.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import anthropic
import openai
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
    stream_text,
    wait_routable,
)

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me about rivers."}], "max_tokens": 24}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Engine]:
    eng = await start_engine(tmp_path_factory.mktemp("eng"), "union", "--fast")
    yield eng
    eng.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def coord(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, engine: Engine
) -> AsyncIterator[Coordinator]:
    c = await start_coordinator(tmp_path, nats_server.url, max_body_bytes=4096)
    try:
        await Cluster(Publisher(js)).add(engine)
        await wait_routable(c)
        yield c
    finally:
        c.stop()


async def test_union_json_and_stream_match_direct(coord: Coordinator, engine: Engine) -> None:
    async with aiohttp.ClientSession() as s:
        st, direct, _ = await post(s, f"{engine.url}/v1/chat/completions", CHAT)
        assert st == 200
        st, via, headers = await post(s, f"{coord.url}/v1/chat/completions", CHAT, {"X-Request-Id": "req-42"})
        assert st == 200
        assert via["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
        assert headers["x-request-id"] == "req-42"
        # The engine saw the coordinator's own {root}#a{attempt}, never the client's id.
        assert "req-42" not in via["id"] and "#a1" in via["id"]
        want = direct["choices"][0]["message"]["content"]
        text, chunks = await stream_text(s, f"{coord.url}/v1/chat/completions", {**CHAT, "stream": True})
        assert text == want
        assert chunks[-1] == {"done": True}
        comp = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 12}
        st, d1, _ = await post(s, f"{engine.url}/v1/completions", comp)
        st2, d2, _ = await post(s, f"{coord.url}/v1/completions", comp)
        assert st == st2 == 200
        assert d1["choices"][0]["text"] == d2["choices"][0]["text"]


async def test_embeddings_pass_through(coord: Coordinator, engine: Engine) -> None:
    body = {"model": MODEL, "input": "a sentence to embed"}
    async with aiohttp.ClientSession() as s:
        st, direct, _ = await post(s, f"{engine.url}/v1/embeddings", body)
        st2, via, _ = await post(s, f"{coord.url}/v1/embeddings", body)
    assert st == st2 == 200
    assert via["data"][0]["embedding"] == direct["data"][0]["embedding"]


async def test_anthropic_bad_body_names_the_field(coord: Coordinator) -> None:
    async with aiohttp.ClientSession() as s:
        st, err, _ = await post(s, f"{coord.url}/v1/messages", {"model": MODEL, "messages": []})
    assert st == 400
    assert "max_tokens" in err["error"]["message"]


async def test_models_lists_served_model(coord: Coordinator) -> None:
    async with aiohttp.ClientSession() as s, s.get(f"{coord.url}/v1/models") as r:
        assert r.status == 200
        body = await r.json()
    assert [m["id"] for m in body["data"]] == [MODEL]


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (b"[1, 2]", 400, "invalid_json"),
        (b'{"model": "no-such-model", "prompt": "x"}', 404, "model_not_found"),
        (b'{"model": 7, "prompt": "x"}', 400, "invalid_model"),
        (b'{"model": "motor-sim", "prompt": "x", "stream": "yes"}', 400, "invalid_stream"),
        (b'{"model": "motor-sim", "prompt": "' + b"x" * 5000 + b'"}', 413, "body_too_large"),
    ],
)
async def test_bad_requests_get_openai_errors(
    coord: Coordinator, body: bytes, status: int, code: str | None
) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{coord.url}/v1/completions", data=body, headers={"content-type": "application/json"}) as r,
    ):
        assert r.status == status
        err = (await r.json())["error"]
    assert set(err) == {"message", "type", "code"}
    assert err["code"] == code
    assert err["message"]


async def test_pipelined_requests_are_answered_in_order(coord: Coordinator) -> None:
    import asyncio

    reader, writer = await asyncio.open_connection("127.0.0.1", coord.port)
    reqs = b""
    for i in range(3):
        body = b'{"model":"motor-sim","prompt":"p%d","max_tokens":2}' % i
        reqs += (
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-request-id: pipe-%d\r\ncontent-length: %d\r\n\r\n%b"
            % (
                i,
                len(body),
                body,
            )
        )
    reqs += b"GET /v1/models HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    writer.write(reqs)
    data = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    assert data.count(b"HTTP/1.1 200 OK") == 4
    order = [data.find(b"x-request-id: pipe-%d" % i) for i in range(3)]
    assert -1 not in order and order == sorted(order)
    assert data.rfind(b'"object":"list"') > order[-1]


async def test_expect_100_continue_is_answered(coord: Coordinator) -> None:
    import asyncio

    reader, writer = await asyncio.open_connection("127.0.0.1", coord.port)
    body = b'{"model":"motor-sim","prompt":"p","max_tokens":2}'
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\nconnection: close\r\n"
        b"content-length: %d\r\n\r\n" % len(body)
    )
    first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert first == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(body)
    rest = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    assert rest.startswith(b"HTTP/1.1 200 OK")


async def test_openai_sdk_stream_and_not(coord: Coordinator, engine: Engine) -> None:
    direct = openai.AsyncOpenAI(base_url=f"{engine.url}/v1", api_key="x")
    client = openai.AsyncOpenAI(base_url=f"{coord.url}/v1", api_key="x", max_retries=0)
    try:
        msgs = CHAT["messages"]
        want = await direct.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24)  # type: ignore[arg-type]
        got = await client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=24)  # type: ignore[arg-type]
        assert got.choices[0].message.content == want.choices[0].message.content
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=msgs,  # type: ignore[arg-type]
            max_tokens=24,
            stream=True,
            stream_options={"include_usage": True},
        )
        parts = []
        usage = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
        assert "".join(parts) == want.choices[0].message.content
        assert usage is not None and usage.completion_tokens == want.usage.completion_tokens  # type: ignore[union-attr]
        with pytest.raises(openai.NotFoundError) as info:
            await client.completions.create(model="nope", prompt="x")
        assert "nope" in str(info.value)
    finally:
        await direct.close()
        await client.close()


async def test_anthropic_sdk_stream_and_not(coord: Coordinator, engine: Engine) -> None:
    async with aiohttp.ClientSession() as s:
        st, direct, _ = await post(s, f"{engine.url}/v1/chat/completions", CHAT)
    assert st == 200
    want = direct["choices"][0]["message"]["content"]
    client = anthropic.AsyncAnthropic(base_url=coord.url, api_key="x", max_retries=0)
    try:
        msg = await client.messages.create(
            model=MODEL, max_tokens=24, messages=[{"role": "user", "content": "Tell me about rivers."}]
        )
        assert msg.content[0].text == want  # type: ignore[union-attr]
        assert msg.usage.output_tokens == direct["usage"]["completion_tokens"]
        async with client.messages.stream(
            model=MODEL, max_tokens=24, messages=[{"role": "user", "content": "Tell me about rivers."}]
        ) as stream:
            text = "".join([t async for t in stream.text_stream])
            final = await stream.get_final_message()
        assert text == want
        assert final.stop_reason == "max_tokens"
        count = await client.messages.count_tokens(
            model=MODEL, messages=[{"role": "user", "content": "Tell me about rivers."}]
        )
        assert count.input_tokens > 0
    finally:
        await client.close()


async def test_api_keys_and_no_routable_instance(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    c = await start_coordinator(tmp_path, nats_server.url, api_keys=["sekret"])
    try:
        async with aiohttp.ClientSession() as s:
            body = {"model": MODEL, "prompt": "x"}
            st, err, _ = await post(s, f"{c.url}/v1/completions", body)
            assert st == 401 and err["error"]["code"] == "invalid_api_key"
            st, err, _ = await post(s, f"{c.url}/v1/completions", body, {"Authorization": "Bearer wrong"})
            assert st == 401
            # Authorized, but nothing is registered: the model is unknown (404); no model → 503.
            auth = {"Authorization": "Bearer sekret"}
            st, err, _ = await post(s, f"{c.url}/v1/completions", body, auth)
            assert st == 404
            st, err, _ = await post(s, f"{c.url}/v1/completions", {"prompt": "x"}, auth)
            assert st == 503 and "no instance" in err["error"]["message"]
    finally:
        c.stop()
