"""Errors speak the client's API (issue 14, item 5): on /v1/messages every error is
Anthropic-shaped — the coordinator's own, an engine's refusal passed through, the last
engine error after every attempt failed, a protocol-level refusal of the connection, and the
error that ends a stream already under way — while the OpenAI routes keep theirs.
Real engine and coordinator processes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

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
from tests.integration.rawhttp import exchange, request

MESSAGE = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Name a river."}]}
CHAT = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Name a river."}]}


def anthropic_error(body: Any) -> dict[str, Any]:
    """The inner error of an Anthropic error body (asserting the shape)."""
    assert isinstance(body, dict) and body.get("type") == "error" and set(body) == {"type", "error"}, body
    err = body["error"]
    assert set(err) == {"type", "message"} and err["message"], body
    return err  # type: ignore[no-any-return]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Engine]:
    eng = await start_engine(tmp_path_factory.mktemp("dialects"), "union", "--fast")
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


@pytest.mark.parametrize("stream", [False, True])
async def test_an_engines_refusal_reaches_an_anthropic_client_in_anthropic_shape(
    coord: Coordinator, stream: bool
) -> None:
    # top_p 0 passes the coordinator's Anthropic checks; the engine refuses it (vLLM: (0, 1]).
    async with aiohttp.ClientSession() as s:
        st, body, h = await post(s, f"{coord.url}/v1/messages", {**MESSAGE, "top_p": 0, "stream": stream})
        assert st == 400, body
        err = anthropic_error(body)
        assert err["type"] == "invalid_request_error" and "top_p" in err["message"]
        assert h["content-type"] == "application/json" and h["x-request-id"]
        # The same refusal on the OpenAI route is the engine's own body, passed through.
        st, body, _ = await post(
            s, f"{coord.url}/v1/chat/completions", {**CHAT, "top_p": 0, "stream": stream}
        )
        assert (
            st == 400 and body["error"]["type"] == "BadRequestError" and "top_p" in body["error"]["message"]
        )


async def test_the_coordinators_own_refusals_on_messages_are_anthropic_shaped(coord: Coordinator) -> None:
    async with aiohttp.ClientSession() as s:
        st, body, _ = await post(s, f"{coord.url}/v1/messages", {**MESSAGE, "model": "no-such-model"})
        assert st == 404 and anthropic_error(body)["type"] == "not_found_error"
        st, body, _ = await post(s, f"{coord.url}/v1/chat/completions", {**CHAT, "model": "no-such-model"})
        assert st == 404 and body["error"] == {
            "message": "model 'no-such-model' is not served here",
            "type": "not_found_error",
            "code": "model_not_found",
        }


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens", "/v1/chat/completions"])
async def test_a_refusal_before_the_request_is_read_speaks_its_route(coord: Coordinator, path: str) -> None:
    # A body announced over the limit with `Expect: 100-continue` is refused from the head alone.
    head = request("POST", path, headers={"expect": "100-continue", "content-length": "100000"})
    r = await exchange(coord.port, head.replace(b"content-length: 0\r\n", b""))
    assert r.status == 413, r
    body = r.json()
    if path.startswith("/v1/messages"):
        assert anthropic_error(body)["type"] == "request_too_large"
    else:
        assert isinstance(body, dict) and body["error"]["code"] == "body_too_large"
    # Too many header fields (431): the route is known from the request line.
    many = {f"x-h{i}": "v" for i in range(120)}
    r = await exchange(coord.port, request("POST", path, b"{}", headers=many))
    assert r.status == 431, r
    body = r.json()
    if path.startswith("/v1/messages"):
        assert anthropic_error(body)["type"] == "invalid_request_error"
    else:
        assert isinstance(body, dict) and body["error"]["code"] == "header_fields_too_many"


async def test_every_attempt_failing_answers_an_anthropic_client_in_anthropic_shape(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    failing = await start_engine(tmp_path, "union", "--fast", "--error-rate", "1.0")
    c = await start_coordinator(
        tmp_path,
        nats_server.url,
        retries=1,
        breaker={"failures": 100, "backoff_initial": 1, "backoff_max": 1},
    )
    try:
        await Cluster(Publisher(js)).add(failing)
        async with aiohttp.ClientSession() as s:
            deadline = time.monotonic() + 30
            while True:  # until the table holds the engine: its error, not "no path"
                st, body, _ = await post(s, f"{c.url}/v1/chat/completions", CHAT)
                if st == 500 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert st == 500 and body["error"]["type"] == "InternalServerError", body
            st, body, _ = await post(s, f"{c.url}/v1/messages", MESSAGE)
            assert st == 500
            err = anthropic_error(body)
            assert err["type"] == "api_error" and "injected fault" in err["message"]
    finally:
        c.stop()
        failing.stop()


async def test_a_broken_messages_stream_with_no_path_left_ends_with_an_anthropic_error_event(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    dying = await start_engine(tmp_path, "union", "--fast", "--die-mid-stream", "3")
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        await Cluster(Publisher(js)).add(dying)
        await wait_routable(c, {"model": MODEL, "prompt": "ping", "max_tokens": 1})
        body = {**MESSAGE, "max_tokens": 12, "stream": True}
        async with aiohttp.ClientSession() as s, s.post(f"{c.url}/v1/messages", json=body) as r:
            assert r.status == 200  # the head went out before the engine died
            raw = await r.read()
        events = [block for block in raw.split(b"\n\n") if block.strip()]
        name, data = events[-1].split(b"\n", 1)
        assert name == b"event: error", raw
        err = anthropic_error(orjson.loads(data.removeprefix(b"data: ")))
        assert err["type"] == "api_error" and "no healthy path left" in err["message"]
        assert b"event: message_start" in raw
    finally:
        c.stop()
        dying.stop()
