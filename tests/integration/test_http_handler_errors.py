"""A handler that raises (issue 12, item 4): its request is answered 500 with an error body
and one log line naming the request id, and the connection keeps serving; a response that
broke midway is closed, never left hanging. Both servers, on real sockets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest

from coordinator.proxy.server import ProxyServer
from http1.request import Request
from http1.server import ClientConn
from simengine.router import Response, Router, json_response, start_server
from tests.integration.rawhttp import closed_within, read_replies, request


async def _coord_handler(conn: ClientConn, req: Request) -> None:
    req.rid = "rid-" + req.path.decode().strip("/")
    if req.path == b"/boom":
        raise RuntimeError("a bug on the request path")
    if req.path == b"/half":
        conn.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        raise RuntimeError("a bug after the head went out")
    conn.send(req, 200, b'{"ok":true}')


async def _pipelined(port: int, paths: list[str]) -> list[int]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"".join(request("GET", p, close=False) for p in paths))
        statuses = []
        for reply in await read_replies(reader, len(paths), within=10):
            if reply.status >= 500:
                body = reply.json()
                assert isinstance(body, dict) and body["error"]["message"]
            statuses.append(reply.status)
        return statuses
    finally:
        writer.close()


async def test_the_coordinator_answers_500_and_keeps_serving(caplog: pytest.LogCaptureFixture) -> None:
    server = ProxyServer(_coord_handler, max_body=1024)
    await server.start("127.0.0.1", 0)
    try:
        with caplog.at_level(logging.ERROR, logger="http1.server"):
            assert await _pipelined(server.port, ["/ok", "/boom", "/ok", "/boom", "/ok"]) == [
                200,
                500,
                200,
                500,
                200,
            ]
        lines = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
        assert len(lines) == 2 and all("rid-boom" in ln and "RuntimeError" in ln for ln in lines)
        # A failure after the head went out cannot become a 500: the connection is closed.
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.write(request("GET", "/half", close=False))
        closed, got = await closed_within(reader, 5.0)
        writer.close()
        assert closed and got.startswith(b"HTTP/1.1 200 OK")
        assert await _pipelined(server.port, ["/ok"]) == [200]
    finally:
        await server.stop()


def _engine_router() -> Router:
    def boom(req: Request) -> Response:
        raise KeyError("a bug in a handler")

    async def aboom(req: Request) -> Response:
        await asyncio.sleep(0)
        raise ValueError("a bug in an async handler")

    async def chunks() -> AsyncIterator[bytes]:
        yield b"data: one\n\n"
        raise RuntimeError("a bug mid-stream")

    r = Router()
    r.add("GET", "/ok", lambda req: json_response({"ok": True}))
    r.add("GET", "/boom", boom)
    r.add("GET", "/aboom", aboom)
    r.add("GET", "/stream", lambda req: Response(200, content_type="text/event-stream", stream=chunks()))
    return r


async def test_the_engine_answers_500_and_keeps_serving(caplog: pytest.LogCaptureFixture) -> None:
    server = await start_server(_engine_router(), "127.0.0.1", 0)
    port = server.port
    try:
        with caplog.at_level(logging.ERROR):
            got = await _pipelined(port, ["/ok", "/boom", "/ok", "/aboom", "/ok"])
        assert got == [200, 500, 200, 500, 200]
        assert sum(1 for r in caplog.records if "failed" in r.getMessage()) == 2
        # Counted as the coordinator counts them (`motor_engine_http_rejected_total`).
        assert server.watchdog is not None and server.watchdog.rejects[(500, "internal_error")] == 2
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request("GET", "/stream", close=False))
        closed, data = await closed_within(reader, 5.0)
        writer.close()
        assert closed, "a stream that broke midway left its client hanging"
        assert b"data: one" in data
        assert await _pipelined(port, ["/ok"]) == [200]
    finally:
        await server.stop()
