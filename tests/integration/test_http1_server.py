"""The server core both `/v1` ports run (`http1.server`), on real sockets: a handler that
answers at once runs without a task and pipelined requests keep their order; a handler that
waits runs as the connection's task, which a client's going away cancels; a body over the limit
is dropped and marked for the handler, and the connection keeps serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable

import orjson
import pytest

from http1.request import Request
from http1.server import ClientConn, Server
from simengine.router import Router, json_response, start_server
from tests.integration.rawhttp import read_replies, request


def _body(path: bytes, status: int, message: str, code: str | None) -> bytes:
    return orjson.dumps({"error": {"message": message, "code": code, "path": path.decode()}})


class _Recorder:
    """Answers /now inside the call and /later after a loop turn; records where each ran."""

    def __init__(self) -> None:
        self.tasks: list[tuple[bytes, asyncio.Task[object] | None]] = []
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    def __call__(self, conn: ClientConn, req: Request) -> Awaitable[None] | None:
        if req.too_large:
            conn.send(req, 413, _body(req.path, 413, "too large", "body_too_large"))
            return None
        if req.path == b"/boom":
            raise RuntimeError("the handler failed")
        if req.path == b"/now":
            self.tasks.append((req.path, asyncio.current_task()))
            conn.send(req, 200, b'{"at":"now"}')
            return None
        return self._later(conn, req)

    async def _later(self, conn: ClientConn, req: Request) -> None:
        self.tasks.append((req.path, asyncio.current_task()))
        if req.path == b"/forever":
            self.started.set()
            try:
                await asyncio.Event().wait()
            finally:
                self.cancelled.set()
        await asyncio.sleep(0)
        conn.send(req, 200, b'{"at":"later"}')


@pytest.fixture
async def served() -> AsyncIterator[tuple[Server, _Recorder]]:
    rec = _Recorder()
    server = Server(rec, error_body=_body, max_body=16)
    await server.start("127.0.0.1", 0)
    try:
        yield server, rec
    finally:
        await server.stop()


async def _pipelined(port: int, raw: bytes, n: int) -> list[tuple[int, bytes]]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        return [(r.status, r.body) for r in await read_replies(reader, n, within=10)]
    finally:
        writer.close()


async def test_answers_at_once_run_without_a_task_and_keep_their_order(
    served: tuple[Server, _Recorder],
) -> None:
    server, rec = served
    paths = ["/now", "/later", "/now", "/now", "/later", "/now"]
    got = await _pipelined(server.port, b"".join(request("GET", p, close=False) for p in paths), len(paths))
    assert [b for _, b in got] == [b'{"at":"%s"}' % p[1:].encode() for p in paths]
    assert [p for p, _ in rec.tasks] == [p.encode() for p in paths]
    # One task a waiting handler; answers at once take none (those after a waiting one are
    # served when its task ends, in that task).
    assert rec.tasks[0][1] is None
    assert len({id(t) for _, t in rec.tasks if t is not None}) == paths.count("/later")


async def test_a_client_that_goes_away_cancels_the_waiting_handler(served: tuple[Server, _Recorder]) -> None:
    server, rec = served
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(request("GET", "/forever", close=False))
    await asyncio.wait_for(rec.started.wait(), 10)
    writer.close()
    await asyncio.wait_for(rec.cancelled.wait(), 10)
    assert await asyncio.wait_for(reader.read(), 10) == b""


async def test_a_body_over_the_limit_is_marked_and_the_connection_keeps_serving(
    served: tuple[Server, _Recorder],
) -> None:
    server, _ = served
    raw = request("POST", "/now", b"x" * 17, close=False) + request("GET", "/now", close=False)
    assert [s for s, _ in await _pipelined(server.port, raw, 2)] == [413, 200]


async def test_the_error_body_is_told_the_path_normalised_even_before_the_request_is_read(
    served: tuple[Server, _Recorder],
) -> None:
    """The path picks a dialect (the coordinator's /v1/messages answers Anthropic-shaped)."""
    server, _ = served
    raw = request("GET", "/x/../boom?q=1", close=False) + request("GET", "/now", close=False)
    got = await _pipelined(server.port, raw, 2)
    assert got[0][0] == 500 and orjson.loads(got[0][1])["error"]["path"] == "/boom"
    assert got[1] == (200, b'{"at":"now"}')
    # Too many header fields: refused mid-head, with the path the request line named.
    many = {f"x-h{i}": "v" for i in range(120)}
    [reply] = await _pipelined(server.port, request("POST", "/a//b/?q=1", b"{}", headers=many), 1)
    assert reply[0] == 431 and orjson.loads(reply[1])["error"]["path"] == "/a/b"


async def test_the_engine_refuses_a_body_over_its_limit_in_its_own_shape() -> None:
    r = Router()
    r.add("POST", "/echo", lambda req: json_response({"n": len(req.body)}))
    server = await start_server(r, "127.0.0.1", 0, max_body=16)
    try:
        raw = request("POST", "/echo", b"x" * 17, close=False) + request(
            "POST", "/echo", b"x" * 16, close=False
        )
        got = await _pipelined(server.port, raw, 2)
        assert got[0][0] == 413 and orjson.loads(got[0][1])["error"]["code"] == 413
        assert got[1] == (200, b'{"n":16}')
    finally:
        await server.stop()
