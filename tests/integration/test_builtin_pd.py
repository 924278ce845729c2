"""P/D with builtin engines as real processes: vLLM handoff and SGLang bootstrap.

The proof that P/D is right is that a prefill+decode pair answers exactly what one union
engine answers for the same request, streamed or not; and that every broken handoff fails
clearly instead of producing text.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from tests.integration.builtin_proc import BuiltinEngineProc, free_port, http

SPEED = ("--itl-ms", "1", "--ttft-base-ms", "1")
MSGS = [{"role": "user", "content": "Why split prefill from decode?"}]


class Cluster:
    def __init__(
        self, union: BuiltinEngineProc, prefill: BuiltinEngineProc, decode: BuiltinEngineProc, bport: int
    ):
        self.union, self.prefill, self.decode, self.bootstrap_port = union, prefill, decode, bport


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    logs = tmp_path_factory.mktemp("pd")
    bport = free_port()
    union = BuiltinEngineProc(logs, *SPEED, name="union")
    prefill = BuiltinEngineProc(
        logs, *SPEED, "--role", "prefill", "--bootstrap-port", str(bport), "--kv-ttl", "5", name="prefill"
    )
    decode = BuiltinEngineProc(logs, *SPEED, "--role", "decode", "--bootstrap-timeout", "2", name="decode")
    try:
        for e in (union, prefill, decode):
            e.start()
        yield Cluster(union, prefill, decode, bport)
    finally:
        for e in (union, prefill, decode):
            e.stop()


def post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    status, _, raw = http("POST", url, body)
    return status, orjson.loads(raw)


def sse_text(raw: bytes) -> tuple[str, list[str | None]]:
    """Concatenated text and the finish reasons of an SSE body."""
    text, finishes = [], []
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {"):
            ev = orjson.loads(line[6:])
            if ev["choices"]:
                c = ev["choices"][0]
                text.append(c["delta"].get("content") or "" if "delta" in c else c["text"])
                finishes.append(c["finish_reason"])
    return "".join(text), finishes


def text_of(body: dict[str, Any]) -> str:
    c = body["choices"][0]
    return str(c["message"]["content"] if "message" in c else c["text"])


REQUESTS = [
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 24, "temperature": 0.8, "seed": 9}),
    ("/v1/completions", {"prompt": "Disaggregated serving means", "max_tokens": 24, "temperature": 0}),
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 40, "stop": [","], "temperature": 0}),
]


# ---------------------------------------------------------------------------------- vLLM handoff


def vllm_pd(c: Cluster, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the handoff the way a coordinator does; (prefill answer, decode request body)."""
    pre = {**body, "max_tokens": 1, "stream": False, "kv_transfer_params": {"do_remote_decode": True}}
    pre.pop("stream_options", None)
    status, answer = post(c.prefill.url + path, pre)
    assert status == 200, answer
    return answer, {**body, "kv_transfer_params": answer["kv_transfer_params"]}


@pytest.mark.parametrize(("path", "body"), REQUESTS)
def test_vllm_handoff_equals_union(pd: Cluster, path: str, body: dict[str, Any]) -> None:
    status, union = post(pd.union.url + path, body)
    assert status == 200
    pre, dec_body = vllm_pd(pd, path, body)
    kv = pre["kv_transfer_params"]
    assert kv["do_remote_prefill"] is True and kv["do_remote_decode"] is False
    assert kv["remote_host"] == "127.0.0.1" and kv["remote_port"] == pd.prefill.port
    assert kv["remote_engine_id"] and kv["remote_block_ids"] and kv["remote_request_id"]
    status, dec = post(pd.decode.url + path, dec_body)
    assert status == 200, dec
    assert text_of(dec) == text_of(union)
    assert dec["choices"][0]["finish_reason"] == union["choices"][0]["finish_reason"]
    assert dec["usage"]["completion_tokens"] == union["usage"]["completion_tokens"]
    assert dec["kv_transfer_params"] is None


@pytest.mark.parametrize(("path", "body"), REQUESTS)
def test_vllm_handoff_stream_equals_union(pd: Cluster, path: str, body: dict[str, Any]) -> None:
    _, union = post(pd.union.url + path, body)
    _, dec_body = vllm_pd(pd, path, body)
    status, _, raw = http("POST", pd.decode.url + path, {**dec_body, "stream": True})
    assert status == 200
    text, finishes = sse_text(raw)
    assert text == text_of(union) and finishes[-1] == union["choices"][0]["finish_reason"]
    assert raw.endswith(b"data: [DONE]\n\n")


def test_vllm_kv_is_fetched_once(pd: Cluster) -> None:
    path, body = REQUESTS[1]
    _, dec_body = vllm_pd(pd, path, body)
    assert post(pd.decode.url + path, dec_body)[0] == 200
    status, err = post(pd.decode.url + path, dec_body)
    assert status == 410 and err["error"]["type"] == "KVTransferError" and "gone" in err["error"]["message"]


def test_vllm_kv_of_another_prompt_is_refused_and_kept(pd: Cluster) -> None:
    path, body = REQUESTS[1]
    _, dec_body = vllm_pd(pd, path, body)
    status, err = post(pd.decode.url + path, {**dec_body, "prompt": "a different prompt"})
    assert status == 400 and "different prompt" in err["error"]["message"]
    assert post(pd.decode.url + path, dec_body)[0] == 200  # the right decode still gets it


def test_vllm_wrong_engine_id_and_missing_fields(pd: Cluster) -> None:
    path, body = REQUESTS[1]
    _, dec_body = vllm_pd(pd, path, body)
    kv = dict(dec_body["kv_transfer_params"])
    status, err = post(pd.decode.url + path, {**body, "kv_transfer_params": {**kv, "remote_engine_id": "x"}})
    assert status == 400 and err["error"]["type"] == "KVTransferError"
    status, err = post(pd.decode.url + path, {**body, "kv_transfer_params": {"do_remote_prefill": True}})
    assert status == 400 and err["error"]["param"] == "kv_transfer_params"


def test_vllm_unreachable_prefill_is_502(pd: Cluster) -> None:
    path, body = REQUESTS[1]
    _, dec_body = vllm_pd(pd, path, body)
    kv = {**dec_body["kv_transfer_params"], "remote_port": free_port()}
    status, err = post(pd.decode.url + path, {**body, "kv_transfer_params": kv})
    assert status == 502 and "cannot reach" in err["error"]["message"]


def kv_usage(eng: BuiltinEngineProc) -> float:
    _, _, raw = http("GET", eng.url + "/metrics")
    for line in raw.decode().splitlines():
        if line.startswith("vllm:kv_cache_usage_perc{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no vllm:kv_cache_usage_perc")


def test_vllm_kv_expires_after_ttl(tmp_path: Path, pd: Cluster) -> None:
    with BuiltinEngineProc(tmp_path, "--role", "prefill", "--kv-ttl", "1", "--fast", name="ttl") as short:
        path, body = REQUESTS[1]
        _, answer = post(
            short.url + path, {**body, "max_tokens": 1, "kv_transfer_params": {"do_remote_decode": True}}
        )
        t0 = time.monotonic()
        assert kv_usage(short) > 0 or time.monotonic() - t0 > 1  # held (unless the scrape itself was slow)
        deadline = time.monotonic() + 10
        while kv_usage(short) > 0:
            assert time.monotonic() < deadline, "KV was never released"
            time.sleep(0.05)
        status, _ = post(pd.decode.url + path, {**body, "kv_transfer_params": answer["kv_transfer_params"]})
        assert status == 410


# ---------------------------------------------------------------------------------- SGLang bootstrap


async def wait_room(s: aiohttp.ClientSession, c: Cluster, room: int, state: str) -> None:
    """Poll the prefill's bootstrap server until `room` is in `state`."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        async with s.get(f"http://127.0.0.1:{c.bootstrap_port}/bootstrap/rooms") as r:
            if (await r.json()).get(str(room)) == state:
                return
        await asyncio.sleep(0.02)
    raise AssertionError(f"room {room} never became {state}")


def boot(c: Cluster, room: int, rid: str) -> dict[str, Any]:
    return {
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": c.bootstrap_port,
        "bootstrap_room": room,
        "rid": rid,
    }


async def both(c: Cluster, path: str, pre: dict[str, Any], dec: dict[str, Any]) -> tuple[Any, Any]:
    async with aiohttp.ClientSession() as s:

        async def call(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
            async with s.post(url + path, json=body) as r:
                return r.status, await r.read()

        return await asyncio.gather(call(c.prefill.url, pre), call(c.decode.url, dec))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("path", "body"), REQUESTS)
def test_sglang_bootstrap_equals_union(pd: Cluster, path: str, body: dict[str, Any], stream: bool) -> None:
    _, union = post(pd.union.url + path, body)
    room = hash((path, stream, str(body))) & ((1 << 63) - 1)
    extra = {**boot(pd, room, f"r{room}"), "stream": stream}
    (ps, praw), (ds, draw) = asyncio.run(both(pd, path, {**body, **extra}, {**body, **extra}))
    assert ps == 200 and ds == 200, (praw, draw)
    text = sse_text(draw)[0] if stream else text_of(orjson.loads(draw))
    assert text == text_of(union)
    if not stream:
        assert orjson.loads(praw)["usage"]["completion_tokens"] == 1  # prefill computes the first token only


def test_sglang_decode_first_then_prefill(pd: Cluster) -> None:
    path, body = REQUESTS[0]
    _, union = post(pd.union.url + path, body)
    extra = boot(pd, 777, "late-prefill")

    async def run() -> tuple[tuple[int, bytes], tuple[int, bytes]]:
        async with aiohttp.ClientSession() as s:
            dec = asyncio.ensure_future(s.post(pd.decode.url + path, json={**body, **extra}))
            await wait_room(s, pd, 777, "waiting")
            async with s.post(pd.prefill.url + path, json={**body, **extra}) as p:
                pres = (p.status, await p.read())
            d = await dec
            return pres, (d.status, await d.read())

    (ps, _), (ds, draw) = asyncio.run(run())
    assert (ps, ds) == (200, 200)
    assert text_of(orjson.loads(draw)) == text_of(union)


def test_sglang_decode_without_prefill_times_out(pd: Cluster) -> None:
    path, body = REQUESTS[0]
    t0 = time.monotonic()
    status, err = post(pd.decode.url + path, {**body, **boot(pd, 4242, "lonely")})
    assert status == 504 and err["error"]["type"] == "KVTransferError"
    assert 1.5 < time.monotonic() - t0 < 15


def test_sglang_aborting_prefill_releases_decode(pd: Cluster) -> None:
    path, body = REQUESTS[0]
    extra = boot(pd, 9001, "pre-abort")

    async def run() -> tuple[dict[str, Any], dict[str, Any], float]:
        async with aiohttp.ClientSession() as s:
            pre = asyncio.ensure_future(s.post(pd.prefill.url + path, json={**body, **extra}))
            # The prefill fills the room and waits for a decode; abort it there.
            deadline = time.monotonic() + 10
            aborted = 0
            while not aborted and time.monotonic() < deadline:
                async with s.post(pd.prefill.url + "/abort_request", json={"rid": "pre-abort"}) as a:
                    aborted = (await a.json())["aborted"]
                await asyncio.sleep(0.02)
            p = await pre
            t0 = time.monotonic()
            async with s.post(pd.decode.url + path, json={**body, **extra}) as d:
                return await p.json(), await d.json(), time.monotonic() - t0

    pre, dec, took = asyncio.run(run())
    assert pre["choices"][0]["finish_reason"] == "abort"
    assert dec["choices"][0]["finish_reason"] == "abort"
    assert took < 1.5  # released at once, not after the bootstrap timeout


def test_sglang_aborting_decode_releases_prefill(pd: Cluster) -> None:
    path, body = REQUESTS[0]
    extra = boot(pd, 9002, "dec-abort")

    async def run() -> tuple[dict[str, Any], dict[str, Any], float]:
        async with aiohttp.ClientSession() as s:
            dec = asyncio.ensure_future(s.post(pd.decode.url + path, json={**body, **extra}))
            deadline = time.monotonic() + 10
            aborted = 0
            while not aborted and time.monotonic() < deadline:
                async with s.post(pd.decode.url + "/abort_request", json={"rid": "dec-abort"}) as a:
                    aborted = (await a.json())["aborted"]
                await asyncio.sleep(0.02)
            d = await dec
            dec_answer = await d.json()
            await wait_room(s, pd, 9002, "aborted")
            # The room is closed: a prefill arriving now does not hold its KV for the TTL (5 s).
            t0 = time.monotonic()
            async with s.post(pd.prefill.url + path, json={**body, **extra}) as p:
                return dec_answer, await p.json(), time.monotonic() - t0

    dec, pre, took = asyncio.run(run())
    assert dec["choices"][0]["finish_reason"] == "abort"
    assert pre["choices"][0]["finish_reason"] == "abort"
    assert took < 2
