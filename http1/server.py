"""The HTTP/1.1 server core (asyncio Protocol + httptools) that every `/v1` port runs: the
coordinator's proxy and management ports, the builtin engine's business and bootstrap ports.
Each server brings one request handler and the shape of its error bodies.

The handler is called as `handler(conn, req)`, one request at a time and in order (pipelining
is safe). It answers by writing to `conn` (`send`; `write` and `drain` for a stream) and returns
None when it answered at once (no task is made; the next pipelined request is served in the same
callback) or an awaitable, which the connection runs as one task (`conn.task`). A client that
goes away cancels that task, so what the request held is released (an engine stops generating,
a proxy closes its engine connection and never reuses it). A handler that raises gets its
request answered 500 with one log line naming it, and the connection keeps serving; if part of
the answer was already written, the connection is closed instead. Heads are read within the
server's `HttpLimitsConfig` (`http1.conn`); a body over `max_body` is dropped as it arrives and
the request is marked `too_large` for the handler to refuse.

A server that checks keys brings a head check too (`HeadCheck`: the same `Guard.judge` its
handler's checks call), run on every request head before a byte of its body is buffered: a
request without a valid key is answered 401 there and its connection closed unread, so an
anonymous client can hold neither a body nor a connection slot for long. A head that passes
with a key trusts its connection (`http1.conn`: never evicted at the cap); one that reaches a
public route without a key (a probe) may carry a body of `ANONYMOUS_MAX_BODY` at most and
have one request queued behind the one being served, where a trusted one may pipeline
`MAX_PIPELINED`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from http1 import wire
from http1.auth import AUTHENTICATE, Denial, Pass
from http1.conn import LimitedProtocol, Watchdog
from http1.head import LimitExceeded
from http1.request import Request, normal_path

log = logging.getLogger(__name__)

MAX_PIPELINED = 32  # pause reading past this many requests queued on a trusted connection
# A body a public route takes without a key (a probe, /metrics: they read none): 413 beyond.
ANONYMOUS_MAX_BODY = 16 * 1024


Handler = Callable[["ClientConn", Request], Awaitable[None] | None]
# (path, status, message, code) -> every refusal's and 500's body (the path picks a dialect).
ErrorBody = Callable[[bytes, int, str, str | None], bytes]
# (normalised path, headers) of a request head -> its key check (`Guard.judge`), before the body.
HeadCheck = Callable[[bytes, dict[bytes, bytes]], Denial | Pass]


class Relay(Protocol):
    """A connection whose bytes go on to this client (a proxy's engine connection)."""

    def pause(self) -> None:
        """Stop reading: the client reads slower than this connection delivers."""

    def resume(self) -> None:
        """Read again."""

    def close(self) -> None:
        """The client went away."""


class ClientConn(LimitedProtocol):
    """One client connection."""

    def __init__(
        self,
        handler: Handler,
        watchdog: Watchdog,
        *,
        max_body: int,
        error_body: ErrorBody,
        normalize_paths: bool = True,
        head_check: HeadCheck | None = None,
    ) -> None:
        super().__init__(watchdog)
        self.handler = handler
        self.max_body = max_body
        self.error_body = error_body
        self.normalize_paths = normalize_paths
        self.head_check = head_check
        self.queue: deque[Request] = deque()
        self.task: asyncio.Task[None] | None = None  # the one running the handler, if it waits
        self.paused_reading = False
        self.write_paused = False
        self.drain_waiter: asyncio.Future[None] | None = None
        self.upstream: Relay | None = None  # paused with this client's writing, closed with it
        self.peer: Any = None
        self.sockname: Any = None
        self.writes = 0  # transport writes so far: tells whether a failed request got any byte
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self._body_len = 0
        self._too_large = False
        self._anonymous = False  # the current request passed its head check without a key
        self.draining = False  # the server is going away: no request after the one under way

    # ------------------------------------------------------------------ transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.peer = transport.get_extra_info("peername")
        self.sockname = transport.get_extra_info("sockname")
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.queue.clear()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        up = self.upstream
        if up is not None:
            self.upstream = None
            up.close()
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)

    def pause_writing(self) -> None:
        # The client reads slower than we write: stop reading what we relay to it.
        self.write_paused = True
        self.write_stalled_since = self.loop.time()
        if self.upstream is not None:
            self.upstream.pause()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.write_stalled_since = None
        if self.upstream is not None:
            self.upstream.resume()
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)

    def error_response(
        self, status: int, message: str, code: str, extra: list[tuple[bytes, bytes]] | None = None
    ) -> bytes:
        path = self._head_path()
        body = self.error_body(path, status, message, code)
        return wire.simple_response(status, body, keep_alive=False, extra=extra)

    def _head_path(self) -> bytes:
        """The path of the head being read, as routes see it (refused mid-head: what was read)."""
        raw = self.head.url.partition(b"?")[0]
        return normal_path(raw) if raw and self.normalize_paths else raw

    def busy(self) -> bool:
        return self.task is not None or bool(self.queue)

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._headers = {}
        self._body = []
        self._body_len = 0
        self._too_large = False
        self._anonymous = False

    def headers_done(self, headers: dict[bytes, bytes]) -> None:
        self._headers = headers
        verdict = self.head_check(self._head_path(), headers) if self.head_check is not None else Pass.OPEN
        if isinstance(verdict, Denial):
            if verdict.status == 401:
                # No valid key: refused on the head, the body never read (`LimitedProtocol`).
                raise LimitExceeded(401, verdict.message, verdict.code, [AUTHENTICATE])
            self.trust()  # a user key on an admin route: its handler answers the 403 as before
        elif verdict is Pass.ANONYMOUS:
            self._anonymous = True
        else:
            self.trust()
        cl = headers.get(b"content-length")
        if self._anonymous and cl is not None and (not cl.isdigit() or int(cl) > ANONYMOUS_MAX_BODY):
            raise LimitExceeded(413, _anonymous_too_large(), "body_too_large")
        if cl is not None and cl.isdigit() and int(cl) > self.max_body:
            self._too_large = True
        expect = headers.get(b"expect")
        if expect is not None and expect.lower() == b"100-continue" and self.transport is not None:
            if self._too_large:
                # Refuse before the client sends the body; it may not send it at all.
                self.reject(413, f"request body over the limit of {self.max_body} bytes", "body_too_large")
            elif not self.busy():
                self.transport.write(wire.CONTINUE_100)

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        if self._too_large:
            return
        self._body_len += len(body)
        if self._anonymous and self._body_len > ANONYMOUS_MAX_BODY:
            raise LimitExceeded(413, _anonymous_too_large(), "body_too_large")
        if self._body_len > self.max_body:
            self._too_large = True
            self._body = []
            return
        self._body.append(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        if self.closed:
            return  # an earlier request on this connection ended it
        parser = self.parser
        assert parser is not None  # it is the one calling
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        req = Request(
            parser.get_method(),
            self.head.url,
            self._headers,
            body,
            parser.should_keep_alive() and not self.draining,  # its answer says `close`
            self._too_large,
            self.normalize_paths,
        )
        self._body = []
        if self.task is not None or self.queue:
            self.queue.append(req)
            ahead = MAX_PIPELINED if self.trusted else 1
            if len(self.queue) >= ahead and self.transport is not None and not self.paused_reading:
                self.paused_reading = True
                self.transport.pause_reading()
        else:
            self._serve(req)

    # ------------------------------------------------------------------ request loop

    def _serve(self, req: Request) -> None:
        # Requests answered inside the handler call are served back to back, without a task.
        nxt: Request | None = req
        while nxt is not None:
            before = self.writes
            try:
                pending = self.handler(self, nxt)
            except Exception as exc:
                self.on_handler_error(nxt, exc, answered=self.writes != before)
            else:
                if pending is not None:
                    self.task = self.loop.create_task(self._finish(nxt, pending, before))
                    return
            nxt = self._after(nxt)

    async def _finish(self, req: Request, pending: Awaitable[None], before: int) -> None:
        try:
            await pending
        except asyncio.CancelledError:
            return  # the client went away
        except Exception as exc:
            self.on_handler_error(req, exc, answered=self.writes != before)
        self.task = None
        nxt = self._after(req)
        if nxt is not None:
            self._serve(nxt)

    def _after(self, req: Request) -> Request | None:
        """`req` is answered: the next queued request, or None (closed, or idle from now)."""
        if self.closed:
            return None
        if not req.keep_alive or self.draining:
            self.close()
            return None
        if self.queue:
            return self.queue.popleft()
        if self.paused_reading and self.transport is not None:
            self.paused_reading = False
            self.transport.resume_reading()
        self.request_served()
        return None

    def on_handler_error(self, req: Request, exc: Exception, *, answered: bool) -> None:
        """A handler raised: answer 500 if nothing was written yet, else close; log one line."""
        self.watchdog.rejected(500, "internal_error")
        self.log_failure(req, exc)
        if answered:
            # Whatever was written, the response is no longer in a known state.
            self.close()
            return
        message = f"internal error ({type(exc).__name__}); request {req.rid or '-'}"
        body = self.error_body(req.path, 500, message, None)
        self.send(req, 500, body, extra=[(b"x-request-id", req.rid.encode())] if req.rid else None)

    def log_failure(self, req: Request, exc: BaseException) -> None:
        """The one error line of a failed request: its id, the client's id, the exception."""
        client = req.headers.get(b"x-request-id")
        log.error(
            "request %s (%s %s, x-request-id %r) failed: %s: %s",
            req.rid or "-", req.method.decode("latin-1"), req.raw_path.decode("latin-1")[:200],
            client.decode("latin-1")[:128] if client else None, type(exc).__name__, exc, exc_info=exc,
        )  # fmt: skip

    # ------------------------------------------------------------------ writing

    def write(self, data: bytes) -> None:
        """Write raw bytes to the client (dropped when it is gone)."""
        if not self.closed and not self.lingering and self.transport is not None:
            self.writes += 1
            self.transport.write(data)

    async def drain(self) -> None:
        """Wait until the client has read enough of what was written (or is gone)."""
        if self.write_paused and not self.closed:
            self.drain_waiter = self.loop.create_future()
            await self.drain_waiter

    def send(
        self,
        req: Request,
        status: int,
        body: bytes,
        *,
        content_type: bytes = wire.JSON_CT,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """Write a complete response to `req` (a HEAD request gets the head alone)."""
        data = wire.simple_response(
            status, body, keep_alive=req.keep_alive, content_type=content_type, extra=extra
        )
        self.write(data[: len(data) - len(body)] if req.method == b"HEAD" and body else data)


def _anonymous_too_large() -> str:
    return f"a request without a key may carry {ANONYMOUS_MAX_BODY} body bytes at most"
