"""One pipeline serves every client route: regressions of the copies it replaced.

The engine-native routes (`/generate`, `/tokenize` …) had their own copy of the `/v1`
admission and attempt loop, and the copies drifted. Each test here is named after one drift
and fails on the code before the pipeline; all run a real coordinator process in front of real
builtin engines, but one: which request id an abort names is seen only by the engine that
receives it, so that test's engine is a recording stand-in speaking just enough HTTP.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import orjson
from nats.js import JetStreamContext

from http1 import wire
from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.integration.coord_harness import (
    MODEL,
    Cluster,
    Coordinator,
    post,
    start_coordinator,
    start_engine,
    wait_routable,
)

TOKENIZE = {"model": MODEL, "prompt": "rivers run"}


async def coord_metric(s: aiohttp.ClientSession, c: Coordinator, name: str, *labels: str) -> float:
    async with s.get(f"{c.url}/metrics") as r:
        text = await r.text()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and all(label in line for label in labels)
    )


async def test_native_routes_count_rate_limited_refusals(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    """Regression: a native route's 429 counted no `rate_limited` and was counted as route `other`."""
    eng = await start_engine(tmp_path, "union", "--fast")
    c = await start_coordinator(
        tmp_path, nats_server.url, rate_limit={"requests_per_second": 0.2, "burst": 1}
    )
    try:
        await Cluster(Publisher(js)).add(eng)
        async with aiohttp.ClientSession() as s:
            for _ in range(200):  # the first admitted request spends the burst (a 404 while folding)
                st, body, h = await post(s, f"{c.url}/tokenize", TOKENIZE)
                if st == 429:
                    break
                await asyncio.sleep(0.05)
            assert st == 429 and body["error"]["code"] == "rate_limit_exceeded"
            assert 1 <= int(h["retry-after"]) <= 5
            assert await coord_metric(s, c, "motor_coordinator_rate_limited_total", 'reason="rate"') == 1
            requests = "motor_coordinator_requests_total"
            assert await coord_metric(s, c, requests, 'route="tokenize"', 'status="429"') == 1
    finally:
        c.stop()
        eng.stop()


async def test_a_native_504_carries_the_clients_request_id(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    """Regression: a native route's request timeout answered 504 without `x-request-id`."""
    slow = await start_engine(tmp_path, "union", "--fast", "--slow-tokens-ms", "300")
    c = await start_coordinator(tmp_path, nats_server.url, request_timeout=1.0)
    try:
        await Cluster(Publisher(js)).add(slow)
        await wait_routable(c)
        async with aiohttp.ClientSession() as s:
            body = {"text": "slow", "sampling_params": {"max_new_tokens": 40}}
            st, err, headers = await post(s, f"{c.url}/generate", body, {"x-request-id": "native-504"})
            assert st == 504 and err["error"]["code"] == "request_timeout"
            assert headers.get("x-request-id") == "native-504"
            requests = "motor_coordinator_requests_total"
            assert await coord_metric(s, c, requests, 'route="generate"', 'status="504"') == 1
    finally:
        c.stop()
        slow.stop()


async def test_a_timed_out_v1_request_is_counted_once(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    """Regression: a /v1 request that hit the request timeout was counted twice as a 504."""
    slow = await start_engine(tmp_path, "union", "--fast", "--slow-tokens-ms", "300")
    c = await start_coordinator(tmp_path, nats_server.url, request_timeout=1.0)
    try:
        await Cluster(Publisher(js)).add(slow)
        await wait_routable(c)
        async with aiohttp.ClientSession() as s:
            body = {"model": MODEL, "prompt": "slow", "max_tokens": 40}
            st, err, headers = await post(s, f"{c.url}/v1/completions", body, {"x-request-id": "v1-504"})
            assert st == 504 and err["error"]["code"] == "request_timeout"
            assert headers.get("x-request-id") == "v1-504"
            requests = "motor_coordinator_requests_total"
            assert await coord_metric(s, c, requests, 'route="completions"', 'status="504"') == 1
    finally:
        c.stop()
        slow.stop()


class RecordingEngine:
    """An SGLang-speaking stand-in that records the request ids it is sent: `/generate`
    streams one event, then goes silent; `/abort_request` is answered and its `rid` kept;
    anything else gets an empty JSON body (so the coordinator's probe can route to it)."""

    def __init__(self) -> None:
        self.generated: list[str] = []
        self.aborted: list[str] = []
        self.server: asyncio.Server | None = None
        self.port = 0
        self.role, self.bootstrap_port = "union", None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ")[1]
                headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if path == "/generate":
                    self.generated.append(headers["x-request-id"])
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                        + wire.chunk(b'data: {"text": "a", "meta_info": {"id": "x"}}\n\n')
                    )
                    await writer.drain()
                    await reader.read()  # silent until the coordinator gives up on it
                    return
                if path == "/abort_request":
                    self.aborted.append(orjson.loads(body)["rid"])
                reply = b'{"aborted": 0}' if path == "/abort_request" else b"{}"
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                    % (len(reply), reply)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def test_a_stalled_native_stream_is_aborted_under_its_own_request_id(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    """Regression: a native stream that stalled was aborted as `{root}#a0`, an id no engine
    was ever sent (its engine request was `{root}#a1`)."""
    eng = RecordingEngine()
    await eng.start()
    c = await start_coordinator(tmp_path, nats_server.url, inter_token_timeout=0.5, first_token_timeout=10)
    try:
        await Cluster(Publisher(js)).add(eng, engine_type="sglang")  # type: ignore[arg-type]
        await wait_routable(c)
        async with aiohttp.ClientSession() as s:
            body = orjson.dumps({"text": "hello", "stream": True})
            async with s.post(f"{c.url}/generate", data=body) as r:
                assert r.status == 200
                try:
                    await r.read()
                except aiohttp.ClientPayloadError:
                    pass  # cut: a native stream is not continued
        deadline = time.monotonic() + 10
        while not eng.aborted:
            assert time.monotonic() < deadline, "the stalled request was never aborted"
            await asyncio.sleep(0.05)
        assert len(eng.generated) == 1 and eng.generated[0].endswith("#a1")
        assert eng.aborted == eng.generated
    finally:
        c.stop()
        await eng.stop()


async def test_a_broken_native_stream_is_cut_not_ended_as_complete(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    """Regression: a native stream whose engine died midway got `data: [DONE]` and a clean end,
    as if its answer were whole (a native body cannot be continued: the client must see a cut)."""
    dying = await start_engine(tmp_path, "union", "--fast", "--die-mid-stream", "3")
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        await Cluster(Publisher(js)).add(dying)
        await wait_routable(c)
        got = b""
        cut = False
        async with aiohttp.ClientSession() as s:
            body = {"text": "a long tale", "stream": True, "sampling_params": {"max_new_tokens": 30}}
            async with s.post(f"{c.url}/generate", data=orjson.dumps(body)) as r:
                assert r.status == 200
                try:
                    async for data in r.content.iter_any():
                        got += data
                except aiohttp.ClientPayloadError:
                    cut = True
        deadline = time.monotonic() + 10
        while dying.alive():  # its exit shows a moment after its socket closed
            assert time.monotonic() < deadline, "the engine never died mid-stream"
            await asyncio.sleep(0.05)
        assert got.count(b"data: {") == 3, got
        assert b"[DONE]" not in got, got
        assert cut, "the client saw a clean end of a stream cut midway"
        assert "cut, it cannot be continued" in c.log_text()
    finally:
        c.stop()
        dying.stop()
