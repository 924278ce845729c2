"""The engine's request handler on the shared server core (`http1.server`): routes by method
and path to handlers that return a `Response`, and writes it, built for low CPU per request.

A handler returns a `Response` directly when it can answer without waiting (no task is made
then), or an awaitable of one. Streamed bodies use chunked encoding and respect the client's
back-pressure; a client that goes away cancels the running handler, so the engine releases what
the request held. The server core answers pipelined requests in order and reads heads within
the engine's HTTP limits.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from typing import Any

import orjson

from core.coordconfig import HttpLimitsConfig
from core.http_errors import engine_error
from http1.listen import Server
from http1.metrics import HttpCollector
from http1.request import Request
from http1.server import ClientConn

MAX_BODY = 64 * 1024 * 1024


class Response:
    """A response: a whole body, a list of chunks ready now, or a stream of body chunks.

    `parts` are sent with chunked framing, one transport write per part, as an engine writes
    one SSE event per token; `stream` yields parts over time.
    """

    __slots__ = ("body", "content_type", "headers", "on_sent", "parts", "status", "stream")

    def __init__(
        self,
        status: int = 200,
        body: bytes = b"",
        content_type: str = "application/json",
        stream: AsyncIterator[bytes] | None = None,
        headers: tuple[tuple[str, str], ...] = (),
        on_sent: Callable[[], None] | None = None,
        parts: list[bytes] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.parts = parts
        self.content_type = content_type
        self.stream = stream
        self.headers = headers
        self.on_sent = on_sent  # called once the response was handed to the transport


HandlerResult = Response | Awaitable[Response]
Handler = Callable[[Request], HandlerResult]


def json_response(obj: Any, status: int = 200) -> Response:
    """A JSON response."""
    return Response(status, orjson.dumps(obj))


class Router:
    """Exact (method, path) routes plus prefix routes for paths with a trailing parameter.

    Paths are matched as sent (the engine's server does not normalise them), as an engine does."""

    def __init__(self) -> None:
        self._exact: dict[tuple[bytes, bytes], Handler] = {}
        self._methods: dict[bytes, set[bytes]] = {}
        self._prefix: list[tuple[bytes, bytes, Handler]] = []

    def add(self, method: str, path: str, handler: Handler) -> None:
        """Route `method path` to `handler`; a path ending in '/*' matches any tail."""
        m, p = method.encode("latin-1"), path.encode("latin-1")
        if p.endswith(b"/*"):
            self._prefix.append((m, p[:-1], handler))
        else:
            self._exact[(m, p)] = handler
        self._methods.setdefault(p, set()).add(m)

    def resolve(self, method: bytes, path: bytes) -> Handler | int | None:
        """The handler, or 404 / 405 as an int."""
        handler = self._exact.get((method, path))
        if handler is not None:
            return handler
        for m, prefix, h in self._prefix:
            if path.startswith(prefix) and m == method:
                return h
        if path in self._methods or any(path.startswith(p) for _, p, _ in self._prefix):
            return 405
        return 404


def error_body(path: bytes, status: int, message: str, code: str | None = None) -> bytes:
    """The engine's error body on any path, as vLLM shapes it (`code` is the HTTP status there)."""
    return engine_error(status, message)


_REASONS = {s.value: s.phrase for s in HTTPStatus}


_STATUS_LINES: dict[tuple[int, str], bytes] = {}


def _head(
    status: int, content_type: str, length: int | None, keep_alive: bool, extra: tuple[tuple[str, str], ...]
) -> bytes:
    # The status line and content type repeat on nearly every response: build them once.
    first = _STATUS_LINES.get((status, content_type))
    if first is None:
        line = f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\ncontent-type: {content_type}\r\n"
        first = _STATUS_LINES[(status, content_type)] = line.encode("latin-1")
    head = first + (
        b"transfer-encoding: chunked\r\n" if length is None else b"content-length: %d\r\n" % length
    )
    if not keep_alive:
        head += b"connection: close\r\n"
    for k, v in extra:
        head += f"{k}: {v}\r\n".encode("latin-1")
    return head + b"\r\n"


OnError = Callable[[Exception], Response | None]


class Dispatch:
    """The engine's handler on the server core: route the request, call, write the `Response`."""

    __slots__ = ("on_error", "router")

    def __init__(self, router: Router, on_error: OnError | None = None) -> None:
        self.router = router
        # Maps a handler's exception to its answer; None leaves it to the core (500, logged).
        self.on_error = on_error

    def __call__(self, conn: ClientConn, req: Request) -> Awaitable[None] | None:
        """Answer `req` now and return None, or return what answers it later."""
        result: HandlerResult
        handler = self.router.resolve(req.method, req.path)
        if isinstance(handler, int) or handler is None:
            status = handler or 404
            text = (
                "Not Found"
                if status == 404
                else f"method {req.method.decode('latin-1')} not allowed on {req.path.decode('latin-1')}"
            )
            result = Response(status, engine_error(status, text))
        elif req.too_large:
            result = Response(413, engine_error(413, f"request body over the limit of {conn.max_body} bytes"))
        else:
            try:
                result = handler(req)
            except Exception as exc:
                result = self._mapped(conn, req, exc)
        if isinstance(result, Response) and result.stream is None:
            _write_whole(conn, req, result)
            return None
        return self._complete(conn, req, result)

    def _mapped(self, conn: ClientConn, req: Request, exc: Exception) -> Response:
        resp = self.on_error(exc) if self.on_error is not None else None
        if resp is None:
            raise exc
        if resp.status >= 500:
            conn.log_failure(req, exc)
        return resp

    async def _complete(self, conn: ClientConn, req: Request, result: HandlerResult) -> None:
        if isinstance(result, Response):
            resp = result
        else:
            try:
                resp = await result
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                resp = self._mapped(conn, req, exc)
        if resp.stream is None:
            _write_whole(conn, req, resp)
        else:
            await _write_stream(conn, req, resp)


def _write_whole(conn: ClientConn, req: Request, resp: Response) -> None:
    # To the transport directly (`conn.write` once a part costs a call a token on this path).
    t = conn.transport
    if t is None or conn.closed or conn.lingering:
        return
    conn.writes += 1
    if resp.parts is not None:
        t.write(_head(resp.status, resp.content_type, None, req.keep_alive, resp.headers))
        for part in resp.parts:
            if part:
                t.write(b"%x\r\n%b\r\n" % (len(part), part))
        t.write(b"0\r\n\r\n")
    else:
        head = _head(resp.status, resp.content_type, len(resp.body), req.keep_alive, resp.headers)
        t.write(head if req.method == b"HEAD" else head + resp.body)
    if resp.on_sent is not None:
        resp.on_sent()


async def _write_stream(conn: ClientConn, req: Request, resp: Response) -> None:
    stream = resp.stream
    assert stream is not None
    try:
        conn.write(_head(resp.status, resp.content_type, None, req.keep_alive, resp.headers))
        async for chunk in stream:
            if conn.closed:
                return
            if chunk:
                conn.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
            if conn.write_paused:
                await conn.drain()
        if not conn.closed:
            conn.write(b"0\r\n\r\n")
            if resp.on_sent is not None:
                resp.on_sent()
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            await aclose()


async def start_server(
    router: Router,
    host: str,
    port: int,
    on_error: OnError | None = None,
    sock: socket.socket | None = None,
    limits: HttpLimitsConfig | None = None,
    collector: HttpCollector | None = None,
    max_body: int = MAX_BODY,
) -> Server:
    """Listen on host:port (or an already bound socket) and serve `router` within `limits`;
    `collector` exports its connections and refusals."""
    server = Server(
        Dispatch(router, on_error),
        error_body=error_body,
        max_body=max_body,
        limits=limits,
        normalize_paths=False,
    )
    await server.start(host, port, sock=sock)
    if collector is not None:
        assert server.watchdog is not None
        collector.add(server.watchdog)
    return server
