"""A client that reads nothing of its stream is cut after `coordinator.http.write_stall_timeout`,
and the engine's slot is freed with it (issue 24: a slow reader held an engine slot until
`request_timeout`, 600 s). A client that reads, however slowly it started, keeps its stream."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import aiohttp
import orjson
from nats.js import JetStreamContext

from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.integration.coord_harness import (
    MODEL,
    Cluster,
    Engine,
    start_coordinator,
    start_engine,
    stream_text,
    wait_routable,
)

STALL = 1.5  # write_stall_timeout of the test's coordinator


async def running(s: aiohttp.ClientSession, eng: Engine) -> float:
    async with s.get(f"{eng.url}/metrics") as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith("vllm:num_requests_running"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("the engine exposes no vllm:num_requests_running")


def open_stream_and_never_read(port: int) -> socket.socket:
    """A raw client asking for a long stream with a tiny receive buffer, then reading nothing."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    body = orjson.dumps(
        {"model": MODEL, "prompt": "a very long story", "max_tokens": 200_000, "stream": True}
    )
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    sock.sendall(head + body)
    return sock


async def test_a_client_that_reads_nothing_is_cut_and_frees_the_engine(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    long = ("--max-model-len", "300000", "--num-blocks", "20000")  # room for a 200,000-token stream
    eng = await start_engine(tmp_path, "union", "--fast", "--slow-tokens-ms", "1", *long)
    c = await start_coordinator(tmp_path, nats_server.url, http={"write_stall_timeout": STALL})
    sock: socket.socket | None = None
    try:
        await Cluster(Publisher(js)).add(eng, max_seq_len=300_000)
        await wait_routable(c)
        async with aiohttp.ClientSession() as s:
            sock = open_stream_and_never_read(c.port)
            deadline = time.monotonic() + 20
            while await running(s, eng) < 1:
                if time.monotonic() > deadline:
                    sock.settimeout(2)
                    raise AssertionError(f"the engine never got the request: {sock.recv(2000)!r}")
                await asyncio.sleep(0.05)
            began = time.monotonic()
            while await running(s, eng) > 0:
                # The socket buffers fill first (the kernel grows the send buffer to 4 MiB: ~20 s
                # of this stream): the bound is far below the 600 s request timeout, not tight.
                assert time.monotonic() - began < 60, "the engine still serves a client that reads nothing"
                await asyncio.sleep(0.1)
            freed_after = time.monotonic() - began
            assert freed_after >= STALL * 0.5, f"freed after {freed_after:.1f} s: before the client stalled?"
            # The connection was cut: what is buffered drains, then the stream ends without [DONE].
            sock.settimeout(10)
            got = b""
            while chunk := sock.recv(65536):
                got += chunk
            assert got.startswith(b"HTTP/1.1 200") and b"data: [DONE]" not in got
            # The coordinator serves on (a reader that reads is untouched).
            text, _ = await stream_text(
                s,
                f"{c.url}/v1/completions",
                {"model": MODEL, "prompt": "short", "max_tokens": 8, "stream": True},
            )
            assert text
        assert "read nothing for" in c.log_text()
    finally:
        if sock is not None:
            sock.close()
        for p in (c, eng):
            p.stop()
