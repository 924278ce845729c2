"""The inter-token timeout on a real socket: an engine that goes silent mid-stream fails the
exchange as a stall; silence while the coordinator itself holds the stream back (a slow
client paused reading) is not the engine's and does not count."""

from __future__ import annotations

import asyncio
import time

import pytest

from coordinator.proxy.pool import UpstreamPool
from coordinator.proxy.upstream import UpstreamError
from http1 import wire

REQUEST = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}"


async def silent_engine() -> tuple[asyncio.Server, int]:
    """An HTTP server that sends a stream's head and one event, then nothing for 30 s."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.readexactly(2)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        writer.write(wire.chunk(b'data: {"choices": [{"text": "a"}]}\n\n'))
        await writer.drain()
        try:
            await asyncio.sleep(30)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize("held_by_client", [False, True])
async def test_silence_mid_stream_is_a_stall_unless_the_client_holds_the_stream(held_by_client: bool) -> None:
    server, port = await silent_engine()
    loop = asyncio.get_running_loop()
    pool = UpstreamPool(loop)
    pool.inter_token_timeout = 0.4
    try:
        conn = await pool.connect("127.0.0.1", port)
        await conn.send(REQUEST, 5.0)  # head and the first event
        got: list[bytes] = []
        t0 = time.monotonic()
        done = conn.stream_to(got.append)
        assert done is not None and got
        if held_by_client:
            conn.pause()  # the client's socket is full: we stopped reading the engine
            await asyncio.sleep(1.5)
            assert not done.done(), "a stream held back by a slow client was failed as a stall"
            conn.resume()
            t0 = time.monotonic()
        with pytest.raises(UpstreamError) as err:
            await asyncio.wait_for(done, 5)
        took = time.monotonic() - t0
        assert err.value.stalled and err.value.timeout and err.value.kind == "stall"
        assert "inter-token timeout" in str(err.value)
        assert 0.35 <= took < 2.0
        assert conn.closed and not pool.streaming  # the engine saw the disconnect; nothing left watched
    finally:
        pool.close()
        server.close()
        await server.wait_closed()
