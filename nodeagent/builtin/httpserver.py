"""A small HTTP/1.1 server on asyncio.Protocol + httptools, built for low CPU per request.

Handlers return a `Response` directly when they can answer without waiting (no task is
created then), or an awaitable of one. Responses on a connection are written in request
order, so pipelining is safe; streamed bodies use chunked encoding and respect transport
back-pressure. When the client goes away, the running handler is cancelled so the engine
can release what the request held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from typing import Any, cast

import httptools
import orjson

log = logging.getLogger(__name__)

_MAX_PIPELINED = 64  # pause reading past this many queued requests on one connection
_MAX_BODY = 64 * 1024 * 1024


class Request:
    """One parsed HTTP request."""

    __slots__ = ("body", "headers", "keep_alive", "method", "path", "query")

    def __init__(
        self, method: str, path: str, query: str, headers: dict[bytes, bytes], body: bytes, keep_alive: bool
    ) -> None:
        self.method = method
        self.path = path
        self.query = query
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive

    def header(self, name: bytes) -> str | None:
        """A header value by lower-case name."""
        value = self.headers.get(name)
        return value.decode("latin-1") if value is not None else None

    def query_params(self) -> dict[str, str]:
        """The query string as a dict (last value wins)."""
        from urllib.parse import parse_qsl

        return dict(parse_qsl(self.query, keep_blank_values=True))


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
    """Exact (method, path) routes plus prefix routes for paths with a trailing parameter."""

    def __init__(self) -> None:
        self._exact: dict[tuple[str, str], Handler] = {}
        self._methods: dict[str, set[str]] = {}
        self._prefix: list[tuple[str, str, Handler]] = []

    def add(self, method: str, path: str, handler: Handler) -> None:
        """Route `method path` to `handler`; a path ending in '/*' matches any tail."""
        if path.endswith("/*"):
            self._prefix.append((method, path[:-1], handler))
        else:
            self._exact[(method, path)] = handler
        self._methods.setdefault(path, set()).add(method)

    def resolve(self, method: str, path: str) -> Handler | int | None:
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


def _error_body(status: int, message: str) -> bytes:
    kind = {404: "NotFoundError", 405: "MethodNotAllowed", 413: "PayloadTooLarge"}.get(
        status, "BadRequestError"
    )
    if status >= 500:
        kind = "InternalServerError"
    return orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": status}})


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


class HttpProtocol(asyncio.Protocol):
    """One client connection."""

    def __init__(self, router: Router, on_error: Callable[[BaseException], Response] | None = None) -> None:
        self._router = router
        self._on_error = on_error
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._body_len = 0
        self._pending: deque[Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._busy = False
        self._closed = False
        self._reading_paused = False
        self._writable: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ transport callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._pending.clear()
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._writable is not None and not self._writable.done():
            self._writable.set_exception(ConnectionResetError("client went away"))

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._fail(400, f"malformed HTTP request: {exc}")

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._body = []
        self._body_len = 0

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_headers_complete(self) -> None:
        # curl sends `Expect: 100-continue` for larger bodies and waits for this line.
        if self._headers.get(b"expect", b"").lower() == b"100-continue" and self._transport is not None:
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        self._body_len += len(body)
        if self._body_len > _MAX_BODY:
            raise httptools.HttpParserError("request body too large")
        self._body.append(body)

    def on_message_complete(self) -> None:
        url = self._url.decode("latin-1")
        path, _, query = url.partition("?")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        method = self._parser.get_method().decode("latin-1")
        req = Request(method, path, query, self._headers, body, self._parser.should_keep_alive())
        if self._busy:
            self._pending.append(req)
            if len(self._pending) > _MAX_PIPELINED and self._transport is not None:
                self._transport.pause_reading()
                self._reading_paused = True
        else:
            self._dispatch(req)

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, req: Request) -> None:
        while True:
            result = self._call(req)
            if isinstance(result, Response) and result.stream is None:
                self._write_whole(req, result)
                if self._closed or not req.keep_alive or not self._pending:
                    return
                req = self._pending.popleft()
                continue
            self._busy = True
            self._task = asyncio.get_running_loop().create_task(self._run(req, result))
            return

    def _call(self, req: Request) -> HandlerResult:
        handler = self._router.resolve(req.method, req.path)
        if isinstance(handler, int):
            text = "Not Found" if handler == 404 else f"method {req.method} not allowed on {req.path}"
            return Response(handler, _error_body(handler, text))
        if handler is None:
            return Response(404, _error_body(404, "Not Found"))
        try:
            return handler(req)
        except Exception as exc:
            return self._error(exc)

    def _error(self, exc: BaseException) -> Response:
        if self._on_error is not None:
            return self._on_error(exc)
        log.exception("handler failed", exc_info=exc)
        return Response(500, _error_body(500, "internal error"))

    async def _run(self, req: Request, result: HandlerResult) -> None:
        try:
            if isinstance(result, Response):
                resp = result
            else:
                try:
                    resp = await result
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    resp = self._error(exc)
            if resp.stream is None:
                self._write_whole(req, resp)
            else:
                await self._write_stream(req, resp)
        except (asyncio.CancelledError, ConnectionError):
            return
        finally:
            self._busy = False
            self._task = None
        if self._reading_paused and self._transport is not None and not self._closed:
            self._reading_paused = False
            self._transport.resume_reading()
        if self._pending and not self._closed:
            self._dispatch(self._pending.popleft())

    # ------------------------------------------------------------------ writing

    def _write_whole(self, req: Request, resp: Response) -> None:
        t = self._transport
        if t is None or self._closed:
            return
        if resp.parts is not None:
            t.write(_head(resp.status, resp.content_type, None, req.keep_alive, resp.headers))
            for part in resp.parts:
                if part:
                    t.write(b"%x\r\n%b\r\n" % (len(part), part))
            t.write(b"0\r\n\r\n")
        else:
            t.write(
                _head(resp.status, resp.content_type, len(resp.body), req.keep_alive, resp.headers)
                + resp.body
            )
        if resp.on_sent is not None:
            resp.on_sent()
        if not req.keep_alive:
            t.close()

    async def _write_stream(self, req: Request, resp: Response) -> None:
        t = self._transport
        assert t is not None and resp.stream is not None
        stream = resp.stream
        try:
            t.write(_head(resp.status, resp.content_type, None, req.keep_alive, resp.headers))
            async for chunk in stream:
                if self._closed:
                    return
                if chunk:
                    t.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                if self._writable is not None and not self._writable.done():
                    await self._writable
            if not self._closed:
                t.write(b"0\r\n\r\n")
                if resp.on_sent is not None:
                    resp.on_sent()
                if not req.keep_alive:
                    t.close()
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()

    def _fail(self, status: int, message: str) -> None:
        if self._transport is not None and not self._closed:
            body = _error_body(status, message)
            self._transport.write(_head(status, "application/json", len(body), False, ()) + body)
            self._transport.close()
        self._closed = True


async def start_server(
    router: Router,
    host: str,
    port: int,
    on_error: Callable[[BaseException], Response] | None = None,
    sock: socket.socket | None = None,
) -> asyncio.Server:
    """Listen on host:port (or an already bound socket) and serve `router`."""
    loop = asyncio.get_running_loop()
    if sock is not None:
        return await loop.create_server(lambda: HttpProtocol(router, on_error), sock=sock, backlog=2048)
    return await loop.create_server(
        lambda: HttpProtocol(router, on_error), host, port, reuse_address=True, backlog=2048
    )
