"""The client side of the proxy: an asyncio Protocol per connection, httptools request parser.

Requests on one connection are answered in order (pipelining); each runs as one task of the
handler. A client that goes away cancels its task, which closes the engine connections it
uses (an engine stops generating when its client disconnects) and never reuses them.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import httptools

from coordinator.proxy import http1

log = logging.getLogger(__name__)

_MAX_PIPELINED = 32


class Request:
    """One parsed request; header names are lower-case bytes."""

    __slots__ = ("body", "headers", "keep_alive", "method", "path", "query", "too_large", "url")

    def __init__(
        self,
        method: bytes,
        url: bytes,
        headers: dict[bytes, bytes],
        body: bytes,
        keep_alive: bool,
        too_large: bool,
    ) -> None:
        self.method = method
        self.url = url
        q = url.find(b"?")
        self.path = url if q < 0 else url[:q]
        self.query = b"" if q < 0 else url[q + 1 :]
        self.headers = headers
        self.body = body
        self.keep_alive = keep_alive
        self.too_large = too_large


Handler = Callable[["ClientConn", Request], Awaitable[None]]


class ClientConn(asyncio.Protocol):
    """One client connection."""

    def __init__(self, handler: Handler, max_body: int, conns: set[ClientConn]) -> None:
        self.handler = handler
        self.max_body = max_body
        self.conns = conns
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Request] = deque()
        self.task: asyncio.Task[None] | None = None
        self.closed = False
        self.paused_reading = False
        self.write_paused = False
        self.drain_waiter: asyncio.Future[None] | None = None
        self.upstream: Any = None  # the engine connection whose bytes go to this client now
        self.peer: Any = None
        self.sockname: Any = None
        self._url = b""
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._body_len = 0
        self._too_large = False

    # ------------------------------------------------------------------ transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.peer = transport.get_extra_info("peername")
        self.sockname = transport.get_extra_info("sockname")
        self.conns.add(self)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._reject(400, "protocol upgrades are not supported")
        except httptools.HttpParserError as exc:
            self._reject(400, f"malformed HTTP request: {exc}")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.conns.discard(self)
        if self.task is not None and not self.task.done():
            self.task.cancel()
        up = self.upstream
        if up is not None:
            self.upstream = None
            up.close()
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)

    def pause_writing(self) -> None:
        # The client reads slower than the engine writes: stop reading the engine.
        self.write_paused = True
        if self.upstream is not None:
            self.upstream.pause()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.upstream is not None:
            self.upstream.resume()
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self._url = b""
        self._headers = {}
        self._body = []
        self._body_len = 0
        self._too_large = False

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        old = self._headers.get(name)
        self._headers[name] = value if old is None else old + b", " + value

    def on_headers_complete(self) -> None:
        cl = self._headers.get(b"content-length")
        if cl is not None and cl.isdigit() and int(cl) > self.max_body:
            self._too_large = True
        expect = self._headers.get(b"expect")
        if expect is not None and expect.lower() == b"100-continue" and self.transport is not None:
            if self._too_large:
                # Refuse before the client sends the body; it may not send it at all.
                self._reject(413, f"request body over the limit of {self.max_body} bytes")
            elif not self.queue and self.task is None:
                self.transport.write(http1.CONTINUE_100)

    def on_body(self, body: bytes) -> None:
        if self._too_large:
            return
        self._body_len += len(body)
        if self._body_len > self.max_body:
            self._too_large = True
            self._body = []
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        req = Request(
            self.parser.get_method(),
            self._url,
            self._headers,
            body,
            self.parser.should_keep_alive(),
            self._too_large,
        )
        self._body = []
        self.queue.append(req)
        if self.task is None:
            self._next()
        elif len(self.queue) >= _MAX_PIPELINED and self.transport is not None:
            self.paused_reading = True
            self.transport.pause_reading()

    # ------------------------------------------------------------------ request loop

    def _next(self) -> None:
        if self.closed or not self.queue:
            self.task = None
            if self.paused_reading and self.transport is not None and not self.closed:
                self.paused_reading = False
                self.transport.resume_reading()
            return
        req = self.queue.popleft()
        self.task = self.loop.create_task(self._run(req))

    async def _run(self, req: Request) -> None:
        try:
            await self.handler(self, req)
        except asyncio.CancelledError:
            return
        except Exception:
            log.exception("unhandled error serving %s %s", req.method, req.path)
            if not self.closed:
                # Whatever was written, the connection is no longer in a known state.
                self.close()
            return
        if not req.keep_alive:
            self.close()
            return
        self.task = None
        self._next()

    # ------------------------------------------------------------------ writing

    def write(self, data: bytes) -> None:
        """Write raw bytes to the client (dropped when it is gone)."""
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait until the client has read enough of what was written."""
        if self.write_paused and not self.closed:
            self.drain_waiter = self.loop.create_future()
            await self.drain_waiter

    def send(
        self,
        req: Request,
        status: int,
        body: bytes,
        *,
        content_type: bytes = http1.JSON_CT,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """Write a complete response to `req`."""
        self.write(
            http1.simple_response(
                status, body, keep_alive=req.keep_alive, content_type=content_type, extra=extra
            )
        )

    def close(self) -> None:
        """Close the connection after what was written is flushed."""
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()

    def _reject(self, status: int, message: str) -> None:
        from coordinator.errors import error_body

        self.write(http1.simple_response(status, error_body(status, message), keep_alive=False))
        self.close()
        if self.transport is not None:
            self.transport.pause_reading()


class ProxyServer:
    """Owns the listening socket and the set of open client connections."""

    def __init__(self, handler: Handler, *, max_body: int) -> None:
        self.handler = handler
        self.max_body = max_body
        self.conns: set[ClientConn] = set()
        self.server: asyncio.Server | None = None

    async def start(self, host: str, port: int, *, sock: socket.socket | None = None) -> None:
        """Listen on host:port (port 0 picks a free one)."""
        loop = asyncio.get_running_loop()

        def factory() -> ClientConn:
            return ClientConn(self.handler, self.max_body, self.conns)

        if sock is not None:
            self.server = await loop.create_server(factory, sock=sock, backlog=2048)
        else:
            self.server = await loop.create_server(factory, host, port, backlog=2048, reuse_address=True)

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and close every client connection."""
        if self.server is not None:
            self.server.close()
        for c in list(self.conns):
            c.close()
            if c.transport is not None:
                c.transport.abort()
        if self.server is not None:
            await self.server.wait_closed()
