"""The server core both `/v1` ports run (`http1.server`), on real sockets: a handler that
answers at once runs without a task and pipelined requests keep their order; a handler that
waits runs as the connection's task, which a client's going away cancels; a body over the limit
is dropped and marked for the handler, and the connection keeps serving. With a head check
(keys), a keyless head is refused before its body, and at the cap the oldest connection
without a key makes room.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable

import orjson
import pytest

from core.coordconfig import HttpLimitsConfig
from http1.auth import Access, Denial, Guard, Pass
from http1.listen import Server
from http1.request import Request
from http1.server import ClientConn
from simengine.router import Router, json_response, start_server
from tests.integration.rawhttp import closed_within, read_replies, read_reply, request


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


KEYED = {"authorization": "Bearer k"}


@pytest.fixture
async def guarded() -> AsyncIterator[tuple[Server, _Recorder]]:
    rec = _Recorder()
    guard = Guard(["k"])

    def head(path: bytes, headers: dict[bytes, bytes]) -> Denial | Pass:
        public = path in (b"/now", b"/forever")
        return guard.judge(Access.PUBLIC if public else Access.USER, headers.get)

    limits = HttpLimitsConfig(max_connections=4, header_timeout=30.0)
    server = Server(rec, error_body=_body, max_body=1 << 20, limits=limits, head_check=head)
    await server.start("127.0.0.1", 0)
    try:
        yield server, rec
    finally:
        await server.stop()


async def test_a_keyless_head_is_answered_401_and_closed_without_its_body(
    guarded: tuple[Server, _Recorder],
) -> None:
    server, rec = guarded
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        writer.write(b"POST /later HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000\r\n\r\n")
        reply = await read_reply(reader, within=5)
        closed, _ = await closed_within(reader, 5)
    finally:
        writer.close()
    assert reply.status == 401 and reply.headers["www-authenticate"] == 'Bearer realm="motor"'
    assert orjson.loads(reply.body)["error"]["code"] == "invalid_api_key"
    assert closed and rec.tasks == []  # the handler never saw it
    assert (await _pipelined(server.port, request("POST", "/later", b"{}", KEYED), 1)) == [
        (200, b'{"at":"later"}')
    ]


async def test_at_the_cap_the_oldest_keyless_connection_makes_room(guarded: tuple[Server, _Recorder]) -> None:
    server, _ = guarded
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        keyed = await asyncio.open_connection("127.0.0.1", server.port)
        opened.append(keyed)
        keyed[1].write(request("POST", "/now", b"{}", KEYED, close=False))
        assert (await read_reply(keyed[0], within=5)).status == 200  # trusted from now on
        for _ in range(3):  # the cap of 4 full: three slowloris heads
            r, w = await asyncio.open_connection("127.0.0.1", server.port)
            w.write(b"POST /later HTTP/1.1\r\nx-drip: ")
            opened.append((r, w))
        await asyncio.sleep(0.1)
        assert len(server.conns) == 4
        # A newcomer is let in; the oldest slowloris is told 503 and closed for it.
        got = await _pipelined(server.port, request("POST", "/later", b"{}", KEYED), 1)
        assert got == [(200, b'{"at":"later"}')]
        oldest = await read_reply(opened[1][0], within=5)
        assert oldest.status == 503 and orjson.loads(oldest.body)["error"]["code"] == "connection_evicted"
        # The trusted connection was not the one evicted: it still serves.
        keyed[1].write(request("POST", "/now", b"{}", KEYED, close=False))
        assert (await read_reply(keyed[0], within=5)).status == 200
    finally:
        for _, w in opened:
            w.close()


@pytest.mark.parametrize(("headers", "queued"), [({}, 1), (KEYED, 3)])
async def test_a_keyless_connection_is_read_one_request_ahead(
    guarded: tuple[Server, _Recorder], headers: dict[str, str], queued: int
) -> None:
    server, rec = guarded
    _reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    try:
        # Public routes: keyless heads pass them, untrusted. /forever never answers.
        writer.write(request("GET", "/forever", headers=headers, close=False))
        await asyncio.wait_for(rec.started.wait(), 5)
        for _ in range(3):
            writer.write(request("GET", "/now", headers=headers, close=False))
            await asyncio.sleep(0.1)
        [conn] = [c for c in server.conns if isinstance(c, ClientConn)]
        assert len(conn.queue) == queued
        assert conn.paused_reading == (queued == 1)
    finally:
        writer.close()
