"""A whole (non-streamed) answer whose engine is killed -9 midway is continued on another
engine, not generated again: the client gets one JSON body equal to an undisturbed run, and
the surviving engine was asked for the rest (prompt + the partial text, the budget left).
Short answers keep the plain whole path (`coordinator.continue_whole_from_tokens`)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
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
from tests.shapes import same_information

TOKENS = 40
SLOW = ("--fast", "--slow-tokens-ms", "60")  # 40 tokens take ~2.4 s: room to kill midway
BODIES = {
    "chat": {"messages": [{"role": "user", "content": "Tell me about rivers and their deltas"}]},
    "completions": {"prompt": "The long history of lighthouses"},
}


def request(api: str, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": TOKENS, "temperature": 0, **BODIES[api], **extra}


def text_of(api: str, resp: dict[str, Any]) -> str:
    c = resp["choices"][0]
    return str(c["message"]["content"] if api == "chat" else c["text"])


async def seen(s: aiohttp.ClientSession, eng: Engine) -> list[dict[str, Any]]:
    """The generation requests `eng` parsed, oldest first (`GET /admin/requests`)."""
    async with s.get(f"{eng.url}/admin/requests") as r:
        data: list[dict[str, Any]] = await r.json()
        return data


async def first_to_take(s: aiohttp.ClientSession, engines: list[Engine], marker: str) -> Engine:
    """The engine that got a streamed request whose prompt holds `marker` (polled, 20 s)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for eng in engines:
            if any(r["stream"] and marker in (r["prompt"] or "") for r in await seen(s, eng)):
                return eng
        await asyncio.sleep(0.02)
    raise AssertionError("no engine got the request as a stream")


def kill9(eng: Engine) -> None:
    os.killpg(eng.proc.pid, signal.SIGKILL)
    eng.proc.wait(10)


async def cut_midway(c: Coordinator, api: str, candidates: list[Engine]) -> tuple[dict[str, Any], Engine]:
    """Send a whole answer through `c`, kill -9 the engine serving it midway; (answer, victim)."""
    marker = str(BODIES[api].get("prompt") or BODIES[api]["messages"][0]["content"])  # type: ignore[index]
    async with aiohttp.ClientSession() as s:
        task = asyncio.create_task(
            post(s, f"{c.url}/v1/{'chat/completions' if api == 'chat' else api}", request(api))
        )
        try:
            victim = await first_to_take(s, candidates, marker)
            await asyncio.sleep(
                0.8
            )  # a third of its tokens out (the kill must land midway; nothing to await)
            kill9(victim)
            st, resp, _ = await task
        finally:
            task.cancel()
    assert st == 200, resp
    return resp, victim


async def check_continued(
    c: Coordinator, api: str, resp: dict[str, Any], want: dict[str, Any], survivor: Engine
) -> None:
    """The answer equals the undisturbed `want`; `survivor` was asked for the rest only."""
    assert text_of(api, resp) == text_of(api, want)
    assert same_information(resp, want, skip={"id", "created"}), f"{resp}\n{want}"
    assert resp["object"] == want["object"]
    assert resp["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"] == "length"
    for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert resp["usage"][key] == want["usage"][key], key
    assert resp["usage"]["completion_tokens"] == TOKENS
    async with aiohttp.ClientSession() as s:
        asked = [r for r in await seen(s, survivor) if r["stream"]]
    assert asked, "the surviving engine got no streamed request"
    last = asked[-1]
    done = TOKENS - last["max_tokens"]
    assert 0 < done < TOKENS, last  # asked for the budget left, not the whole answer again
    # Its prompt is the client's, then the text the dead engine had generated.
    full = text_of(api, want)
    assert any(last["prompt"].endswith(full[:k]) for k in range(len(full) - 1, 0, -1)), last["prompt"]
    assert "continuing elsewhere" in c.log_text()
    async with aiohttp.ClientSession() as s, s.get(f"{c.url}/metrics") as r:
        metrics = await r.text()
    assert "motor_coordinator_whole_continuations_total 1.0" in metrics


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_whole_answer_cut_by_kill_is_continued_on_union(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, api: str
) -> None:
    a = await start_engine(tmp_path, "union", *SLOW)
    b = await start_engine(tmp_path, "union", *SLOW)
    ref = await start_engine(tmp_path, "union", "--fast")
    c = await start_coordinator(tmp_path, nats_server.url, policy={"union": "round_robin"})
    try:
        async with aiohttp.ClientSession() as s:
            path = "chat/completions" if api == "chat" else api
            st, want, _ = await post(s, f"{ref.url}/v1/{path}", request(api))
            assert st == 200, want
        cluster = Cluster(Publisher(js))
        await cluster.add(a)
        await cluster.add(b)
        await wait_routable(c)
        resp, victim = await cut_midway(c, api, [a, b])
        await check_continued(c, api, resp, want, b if victim is a else a)
    finally:
        for p in (c, a, b, ref):
            p.stop()


async def test_whole_answer_cut_by_kill_is_continued_on_a_pd_pair(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    prefill = await start_engine(tmp_path, "prefill", "--fast")
    d1 = await start_engine(tmp_path, "decode", *SLOW)
    d2 = await start_engine(tmp_path, "decode", *SLOW)
    ref = await start_engine(tmp_path, "union", "--fast")
    c = await start_coordinator(tmp_path, nats_server.url, policy={"decode": "round_robin"})
    try:
        async with aiohttp.ClientSession() as s:
            st, want, _ = await post(s, f"{ref.url}/v1/completions", request("completions"))
            assert st == 200, want
        cluster = Cluster(Publisher(js))
        for e in (prefill, d1, d2):
            await cluster.add(e, engine_type="vllm", capabilities=["handoff"])
        await wait_routable(c)
        resp, victim = await cut_midway(c, "completions", [d1, d2])
        await check_continued(c, "completions", resp, want, d2 if victim is d1 else d1)
    finally:
        for p in (c, prefill, d1, d2, ref):
            p.stop()


async def test_short_whole_answer_keeps_the_plain_path(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    eng = await start_engine(tmp_path, "union", "--fast")
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        cluster = Cluster(Publisher(js))
        await cluster.add(eng)
        await wait_routable(c)
        async with aiohttp.ClientSession() as s:
            short = request("chat", max_tokens=8)
            st, direct, _ = await post(s, f"{eng.url}/v1/chat/completions", short)
            assert st == 200, direct
            st, resp, _ = await post(s, f"{c.url}/v1/chat/completions", short)
            assert st == 200, resp
            assert (await seen(s, eng))[-1]["stream"] is False  # the engine answered it whole
            assert text_of("chat", resp) == text_of("chat", direct)
            # A long one is asked as a stream and folded into the same body as a whole run.
            st, direct, _ = await post(s, f"{eng.url}/v1/chat/completions", request("chat"))
            st, resp, _ = await post(s, f"{c.url}/v1/chat/completions", request("chat"))
            assert st == 200, resp
            assert (await seen(s, eng))[-1]["stream"] is True
            assert same_information(resp, direct, skip={"id", "created"}), f"{resp}\n{direct}"
            # Anthropic's /v1/messages, not streamed, on the folded path.
            msg = {
                "model": MODEL,
                "max_tokens": TOKENS,
                "messages": BODIES["chat"]["messages"],
                "temperature": 0,
            }
            st, out, _ = await post(s, f"{c.url}/v1/messages", msg)
            assert st == 200, out
            assert (await seen(s, eng))[-1]["stream"] is True
            assert out["type"] == "message" and out["stop_reason"] == "max_tokens"
            assert out["content"] == [{"type": "text", "text": text_of("chat", direct)}]
            assert out["usage"] == {
                "input_tokens": direct["usage"]["prompt_tokens"],
                "output_tokens": TOKENS,
            }
            async with s.get(f"{c.url}/metrics") as r:
                metrics = await r.text()
            assert "motor_coordinator_whole_folded_total 2.0" in metrics  # the long two, not the short
    finally:
        c.stop()
        eng.stop()


CUT = ("--fast", "--end-stream-after", "10")  # streams end cleanly, no finish reason, at 10 tokens


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_whole_answer_whose_stream_ends_without_finish_reason_is_continued(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, api: str
) -> None:
    """An engine that ends the stream of a folded whole answer without a finish reason dropped
    the answer: it is continued on another engine, never returned 200 with what it held."""
    bad = await start_engine(tmp_path, "union", *CUT)
    good = await start_engine(tmp_path, "union", "--fast")
    c = await start_coordinator(tmp_path, nats_server.url, policy={"union": "round_robin"})
    try:
        path = "chat/completions" if api == "chat" else api
        async with aiohttp.ClientSession() as s:
            st, want, _ = await post(s, f"{good.url}/v1/{path}", request(api))
            assert st == 200, want
        cluster = Cluster(Publisher(js))
        await cluster.add(bad)
        await cluster.add(good)
        await wait_routable(c)
        async with aiohttp.ClientSession() as s:
            for _ in range(2):  # round robin: one of them is served first by the engine that cuts
                st, resp, _ = await post(s, f"{c.url}/v1/{path}", request(api))
                assert st == 200, resp
                assert text_of(api, resp) == text_of(api, want)
                assert resp["choices"][0]["finish_reason"] == "length"
                assert resp["usage"]["completion_tokens"] == TOKENS
            assert any(r["stream"] for r in await seen(s, bad)), "the cutting engine was never asked"
        assert "continuing elsewhere" in c.log_text()
    finally:
        for p in (c, bad, good):
            p.stop()


async def test_whole_answer_whose_only_engine_ends_without_finish_reason_is_an_error(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    """With no other engine to continue on, the client gets an error, not a 200 holding a
    third of the answer."""
    bad = await start_engine(tmp_path, "union", *CUT)
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        await Cluster(Publisher(js)).add(bad)
        await wait_routable(c)
        async with aiohttp.ClientSession() as s:
            st, resp, _ = await post(s, f"{c.url}/v1/chat/completions", request("chat"))
        assert 500 <= st <= 599, resp
        assert "error" in resp and resp["error"]["message"], resp
    finally:
        for p in (c, bad):
            p.stop()
