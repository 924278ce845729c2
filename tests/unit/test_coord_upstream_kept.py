"""A committed event stream keeps the text it delivered, not its whole body: a long generation
through the coordinator holds a bounded tail of SSE bytes plus its text (issue 24: each stream
kept its whole body), and what a continuation needs of it is unchanged."""

from __future__ import annotations

import asyncio

import orjson

from coordinator.proxy.continuation import progress_of
from coordinator.proxy.pool import UpstreamPool
from coordinator.proxy.upstream import KEEP_BODY

EVENTS = 20_000  # ~4 MiB of SSE framing for 20,000 one-word tokens


def event(i: int) -> bytes:
    obj = {
        "id": "s1",
        "created": 7,
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": f"w{i} "}, "logprobs": None, "finish_reason": None}],
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def test_a_long_event_stream_keeps_its_text_not_its_body() -> None:
    body = b"".join(event(i) for i in range(EVENTS))  # no [DONE]: the stream is still going

    async def engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")  # the request, then the answer
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for i in range(0, len(body), 4096):
            piece = body[i : i + 4096]
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    server = await asyncio.start_server(engine, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        pool = UpstreamPool(asyncio.get_running_loop())
        conn = await pool.connect("127.0.0.1", port)
        await conn.send(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n", 5.0)
        relayed = 0

        def relay(data: bytes) -> None:
            nonlocal relayed
            relayed += len(data)

        fut = conn.stream_to(relay)
        if fut is not None:
            await fut
        assert relayed == len(body)
        held = sum(len(b) for b in conn.body)
        assert held <= min(KEEP_BODY + 8192, len(body) // 20), f"{held} bytes of a {len(body)}-byte body held"
        want = progress_of(body)
        got = conn.progress()
        assert (got.text, got.tokens, got.clean, got.stream_id) == (want.text, EVENTS, True, "s1")
        conn.close()
    finally:
        server.close()
        await server.wait_closed()
