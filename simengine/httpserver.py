"""A small HTTP/1.1 server on asyncio.Protocol + httptools, built for low CPU per request.

Handlers return a `Response` directly when they can answer without waiting (no task is
created then), or an awaitable of one. Responses on a connection are written in request
order, so pipelining is safe; streamed bodies use chunked encoding and respect transport
back-pressure. When the client goes away, the running handler is cancelled so the engine
can release what the request held. Heads are read within the engine's HTTP limits
(`http1`: sizes, header and idle timeouts, the connection cap).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from http import HTTPStatus
from typing import Any

import orjson

from core.config import HttpLimitsConfig
from http1.conn import LimitedProtocol, Watchdog
from http1.head import LimitExceeded
from http1.metrics import HttpCollector

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


_ERROR_TYPES = {
    404: "NotFoundError",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    413: "PayloadTooLarge",
    414: "URITooLong",
    431: "RequestHeaderFieldsTooLarge",
    503: "ServiceUnavailable",
}


def _error_body(status: int, message: str) -> bytes:
    kind = _ERROR_TYPES.get(status) or ("InternalServerError" if status >= 500 else "BadRequestError")
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


class HttpProtocol(LimitedProtocol):
    """One client connection (heads read within the server's limits: `http1`)."""

    def __init__(
        self, router: Router, watchdog: Watchdog, on_error: Callable[[BaseException], Response] | None = None
    ) -> None:
        super().__init__(watchdog)
        self._router = router
        self._on_error = on_error
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._body_len = 0
        self._pending: deque[Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self._busy = False
        self._reading_paused = False
        self._writable: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ transport callbacks

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
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

    def error_response(self, status: int, message: str, code: str) -> bytes:
        body = _error_body(status, message)
        return _head(status, "application/json", len(body), False, ()) + body

    def busy(self) -> bool:
        return self._busy or bool(self._pending)

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._headers = {}
        self._body = []
        self._body_len = 0

    def headers_done(self, headers: dict[bytes, bytes]) -> None:
        self._headers = headers
        # curl sends `Expect: 100-continue` for larger bodies and waits for this line.
        if headers.get(b"expect", b"").lower() == b"100-continue" and self.transport is not None:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        self._body_len += len(body)
        if self._body_len > _MAX_BODY:
            raise LimitExceeded(413, f"request body over the limit of {_MAX_BODY} bytes", "body_too_large")
        self._body.append(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        url = self.head.url.decode("latin-1")
        path, _, query = url.partition("?")
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        method = self.parser.get_method().decode("latin-1")
        req = Request(method, path, query, self._headers, body, self.parser.should_keep_alive())
        if self._busy:
            self._pending.append(req)
            if len(self._pending) > _MAX_PIPELINED and self.transport is not None:
                self.transport.pause_reading()
                self._reading_paused = True
        else:
            self._dispatch(req)

    # ------------------------------------------------------------------ dispatch

    def _dispatch(self, req: Request) -> None:
        while True:
            result = self._call(req)
            if isinstance(result, Response) and result.stream is None:
                self._write_whole(req, result)
                if self.closed or not req.keep_alive:
                    return
                if not self._pending:
                    self.request_served()
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
            return self._error(req, exc)

    def _error(self, req: Request, exc: BaseException) -> Response:
        if self._on_error is not None:
            resp = self._on_error(exc)
            if resp.status < 500:
                return resp
        else:
            resp = Response(500, _error_body(500, "internal error"))
        log.error(
            "request %s (%s %s) failed: %s: %s",
            req.header(b"x-request-id") or "-", req.method, req.path[:200], type(exc).__name__, exc,
            exc_info=exc,
        )  # fmt: skip
        return resp

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
                    resp = self._error(req, exc)
            if resp.stream is None:
                self._write_whole(req, resp)
            else:
                await self._write_stream(req, resp)
        except (asyncio.CancelledError, ConnectionError):
            return
        except Exception as exc:
            # The head is out, the body half-written: nothing sane to add but the close.
            self._error(req, exc)
            self.close()
            return
        finally:
            self._busy = False
            self._task = None
        if self._reading_paused and self.transport is not None and not self.closed:
            self._reading_paused = False
            self.transport.resume_reading()
        if self._pending and not self.closed:
            self._dispatch(self._pending.popleft())
        else:
            self.request_served()

    # ------------------------------------------------------------------ writing

    def _write_whole(self, req: Request, resp: Response) -> None:
        t = self.transport
        if t is None or self.closed or self.lingering:
            return
        if resp.parts is not None:
            t.write(_head(resp.status, resp.content_type, None, req.keep_alive, resp.headers))
            for part in resp.parts:
                if part:
                    t.write(b"%x\r\n%b\r\n" % (len(part), part))
            t.write(b"0\r\n\r\n")
        else:
            head = _head(resp.status, resp.content_type, len(resp.body), req.keep_alive, resp.headers)
            t.write(head if req.method == "HEAD" else head + resp.body)
        if resp.on_sent is not None:
            resp.on_sent()
        if not req.keep_alive:
            self.close()

    async def _write_stream(self, req: Request, resp: Response) -> None:
        t = self.transport
        assert t is not None and resp.stream is not None
        stream = resp.stream
        try:
            t.write(_head(resp.status, resp.content_type, None, req.keep_alive, resp.headers))
            async for chunk in stream:
                if self.closed:
                    return
                if chunk:
                    t.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                if self._writable is not None and not self._writable.done():
                    await self._writable
            if not self.closed:
                t.write(b"0\r\n\r\n")
                if resp.on_sent is not None:
                    resp.on_sent()
                if not req.keep_alive:
                    self.close()
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


async def start_server(
    router: Router,
    host: str,
    port: int,
    on_error: Callable[[BaseException], Response] | None = None,
    sock: socket.socket | None = None,
    limits: HttpLimitsConfig | None = None,
    collector: HttpCollector | None = None,
) -> asyncio.Server:
    """Listen on host:port (or an already bound socket) and serve `router` within `limits`;
    `collector` exports its connections and refusals."""
    loop = asyncio.get_running_loop()
    watchdog = Watchdog(limits or HttpLimitsConfig(), loop)
    if collector is not None:
        collector.add(watchdog)

    def factory() -> HttpProtocol:
        return HttpProtocol(router, watchdog, on_error)

    if sock is not None:
        return await loop.create_server(factory, sock=sock, backlog=2048)
    return await loop.create_server(factory, host, port, reuse_address=True, backlog=2048)
