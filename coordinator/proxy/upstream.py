"""Keep-alive upstream connections to engines: one asyncio Protocol each, pooled per address.

httptools parses a response only to learn its status, headers and where it ends; after the
proxy commits a response to its client, the engine's bytes are written to the client socket
from `data_received` as they arrive, framing included, without a task switch per chunk. The
decoded body is kept alongside, so a stream that dies midway can be continued elsewhere; a
committed event stream keeps it folded (`ProgressFold`: the text it delivered, not its framing)
once it passes `KEEP_BODY`, so a long generation holds its text, not ~20 times that.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Protocol

import httptools

from coordinator.proxy.continuation import Progress, ProgressFold

KEEP_BODY = 64 << 10  # bytes of a committed event stream's body kept as they came, before folding


class UpstreamError(Exception):
    """An exchange with an engine failed; `got_bytes` tells whether any response byte arrived,
    `timeout` that the engine went silent (before its first byte, or mid-stream: `stalled`).

    Two endings are the coordinator's own, charged to no circuit: `left`, the endpoint left
    routing (`Exchanges.leave`), and `lost`, a hedge answered first (`Exchanges.lose`)."""

    def __init__(
        self, message: str, *, got_bytes: bool = False, timeout: bool = False, stalled: bool = False,
        left: bool = False, lost: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.got_bytes = got_bytes
        self.timeout = timeout or stalled
        self.stalled = stalled
        self.left = left
        self.lost = lost

    @property
    def kind(self) -> str:
        """For metrics and the log: stall | timeout | transport | left | slow (lost a hedge)."""
        if self.left or self.lost:
            return "left" if self.left else "slow"
        return "stall" if self.stalled else ("timeout" if self.timeout else "transport")


def _nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


class Registry(Protocol):  # where a connection's exchange is known while it lasts
    def ended(self, conn: UpstreamConn) -> None: ...


class Home(Protocol):
    """What a connection needs of the pool it belongs to (`pool.UpstreamPool`): a place to go
    back to when idle, and the sweeps that time its exchange out."""

    loop: asyncio.AbstractEventLoop
    # Read and popped by the connection itself, not through calls: they are on every exchange.
    first_byte: dict[UpstreamConn, float]  # exchange -> first-byte deadline
    streaming: dict[UpstreamConn, list[float]]  # watched stream -> [body length, when it grew]

    def put(self, conn: UpstreamConn) -> None: ...

    def forget(self, conn: UpstreamConn) -> None: ...

    def watch(self, conn: UpstreamConn, timeout: float) -> None: ...

    def watch_stall(self, conn: UpstreamConn) -> None: ...

    @property
    def exchanges(self) -> Registry: ...  # every exchange under way (`proxy.exchanges.Exchanges`)


class UpstreamConn(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection to an engine, one exchange at a time."""

    def __init__(self, pool: Home, key: tuple[str, int]) -> None:
        self.pool = pool
        self.key = key
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.reused = False
        self.ep_key: str | None = None  # the exchange under way's endpoint (`Exchanges`), and
        self.rid = ""  # its engine request id
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.chunked = False
        self.got_bytes = False
        self.raw = bytearray()  # bytes before the end of the head is known
        self.body_raw: list[bytes] = []  # raw body bytes (framing included) before commit
        self.body: list[bytes] = []  # decoded body (since `kept` last folded it)
        self.body_len = 0
        self.kept: ProgressFold | None = None  # a committed event stream's body folded so far
        self.unfolded = 0  # bytes of `body` a committed event stream has not folded
        self.sse = False  # the response is an event stream
        self.error: UpstreamError | None = None
        self.waiter: asyncio.Future[None] | None = None
        self.forward: asyncio.WriteTransport | None = None  # client transport once committed raw
        self.on_data: Callable[[bytes], None] | None = None  # transform mode after commit
        self.watched = False  # in the pool's first-byte deadline table
        self.stall_watched = False  # in the pool's inter-token table
        self.paused = False  # reading paused for a slow client: silence is not the engine's
        self.chunk_open = False  # inside a chunk: a cut here leaves the client mid-frame

    # ------------------------------------------------------------------ protocol callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass
        _nodelay(transport)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        fwd = self.forward
        if fwd is not None:
            # Committed: pass the bytes through first, then let the parser find the end.
            fwd.write(data)
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserError as exc:
                self._fail(f"bad response from engine: {exc}")
            return
        if not self.head_done:
            self.raw += data
        elif self.on_data is None:
            self.body_raw.append(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"bad response from engine: {exc}")
            return
        if self.head_done and self.raw:
            end = self.raw.find(b"\r\n\r\n")
            rest = bytes(self.raw[end + 4 :])
            self.raw = bytearray()
            if rest and self.on_data is None:
                self.body_raw.append(rest)
        w = self.waiter
        if (
            w is not None
            and not w.done()
            and (self.complete or (self.body_len and self.status < 300 and self.on_data is None))
        ):
            self._unwatch()
            w.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        if not self.complete and self.waiter is not None:
            self._fail("engine closed the connection" + (f": {exc}" if exc else ""))

    def pause_writing(self) -> None:  # engine not reading our request body fast enough
        pass

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.head_done = True
        for n, v in self.headers:
            if n == b"transfer-encoding" and b"chunked" in v.lower():
                self.chunked = True
            elif n == b"content-type" and b"event-stream" in v:
                self.sse = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.body_len += len(body)
        cb = self.on_data
        if self.sse and (self.forward is not None or (cb is not None and cb is not _ignore)):
            self.unfolded += len(body)
            if self.unfolded > KEEP_BODY:
                self._fold_body()
        if cb is not None:
            cb(body)

    def _fold_body(self) -> None:
        kept = self.kept
        if kept is None:
            kept = self.kept = ProgressFold()
        kept.feed(b"".join(self.body))
        self.body = []
        self.unfolded = 0

    def folded(self) -> ProgressFold:
        """This event stream's body, folded whole."""
        self._fold_body()
        assert self.kept is not None
        return self.kept

    def progress(self) -> Progress:
        """What this event stream delivered (its text, tokens, whether it ended cleanly)."""
        return self.folded().result()

    def on_chunk_header(self) -> None:
        self.chunk_open = True

    def on_chunk_complete(self) -> None:
        self.chunk_open = False

    def on_message_complete(self) -> None:
        # httptools resets should_keep_alive() once feed_data returns: read it here.
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True
        self._unwatch()
        if self.stall_watched:
            self._unwatch_stall()
        w = self.waiter
        if w is not None and not w.done() and (self.forward is not None or self.on_data is not None):
            w.set_result(None)

    # ------------------------------------------------------------------ exchange API

    def send(self, data: bytes, first_byte_timeout: float | None) -> asyncio.Future[None]:
        """Write a request; the future resolves at the first body byte, completion or error."""
        self._reset()
        self.waiter = self.loop.create_future()
        if first_byte_timeout is not None:
            self.watched = True
            self.pool.watch(self, first_byte_timeout)
        tr = self.transport
        assert tr is not None
        if not (self.closed or tr.is_closing()):
            try:
                tr.write(data)
                return self.waiter
            except RuntimeError:  # uvloop raises on a handle closed meanwhile (asyncio drops the bytes)
                pass
        # on_closed_before_send: the engine died between the connect (or the pool) and this
        # write. The request never went out: a plain transport failure the attempt loop retries
        # elsewhere, not a handler crash (it answered the client 500 in `just bench chaos`).
        self.closed = True
        self._fail("engine closed the connection before the request went out")
        return self.waiter

    def commit(self, client: asyncio.WriteTransport, head: bytes) -> asyncio.Future[None] | None:
        """Write `head` and the body so far to `client`; forward the rest raw as it arrives.

        Returns None when the response was already complete, else a future resolving at its
        end (or failing when the engine dies midway).
        """
        if self.error is not None:
            raise self.error
        self.raw = bytearray()
        data = head + b"".join(self.body_raw) if self.body_raw else head
        self.body_raw = []
        client.write(data)
        if self.complete:
            return None
        self.forward = client
        self.waiter = self.loop.create_future()
        self.pool.watch_stall(self)
        return self.waiter

    def stream_to(self, on_data: Callable[[bytes], None]) -> asyncio.Future[None] | None:
        """Deliver the decoded body (so far and from now on) to `on_data`.

        None if the response was already complete, else a future resolving at its end or
        failing with the exchange's error (already failed if the engine died before now).
        """
        self.body_raw = []
        for part in self.body:
            on_data(part)
        self.waiter = self.loop.create_future()
        if self.error is not None:
            self.waiter.set_exception(self.error)
            return self.waiter
        if self.complete:
            self.waiter = None
            return None
        self.on_data = on_data
        self.pool.watch_stall(self)
        return self.waiter

    async def read_all(self) -> bytes:
        """Wait for the whole response and return its decoded body."""
        while not self.complete:
            if self.error is not None:
                raise self.error
            self.waiter = self.loop.create_future()
            self.on_data = _ignore
            await self.waiter
        return b"".join(self.body)

    def release(self) -> None:
        """Return the connection to the pool if reusable, otherwise close it."""
        if self.ep_key is not None:
            self.pool.exchanges.ended(self)
        if self.stall_watched:
            self._unwatch_stall()
        self.forward = None
        self.on_data = None
        self.waiter = None
        if self.complete and self.keep_alive and not self.closed and self.error is None:
            self.reused = True
            self.pool.put(self)
        else:
            self.close()

    def close(self) -> None:
        """Close for good (a client abort: the engine sees the disconnect and stops)."""
        if self.ep_key is not None:
            self.pool.exchanges.ended(self)
        self._unwatch()
        if self.stall_watched:
            self._unwatch_stall()
        self.forward = None
        self.on_data = None
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
        self.pool.forget(self)

    def pause(self) -> None:
        self.paused = True
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        self.paused = False
        seen = self.pool.streaming.get(self)
        if seen is not None:
            seen[1] = self.loop.time()  # the engine's silence is measured from now again
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    # ------------------------------------------------------------------ internals

    def _unwatch(self) -> None:
        if self.watched:
            self.watched = False
            self.pool.first_byte.pop(self, None)

    def _unwatch_stall(self) -> None:
        self.stall_watched = False
        self.pool.streaming.pop(self, None)

    def on_stall(self, silent_for: float) -> None:
        """The engine sent nothing mid-stream for the inter-token timeout (the pool's sweep)."""
        self.stall_watched = False
        if self.waiter is not None and not self.waiter.done() and not self.complete:
            self._fail(
                f"engine sent nothing for {silent_for:.1f} s mid-stream (inter-token timeout)", stalled=True
            )

    def depart(self, message: str, *, left: bool = False, lost: bool = False) -> None:
        """End the exchange for a reason of the coordinator's as if the engine had failed."""
        if self.complete or self.waiter is None:
            return
        if self.error is None:
            self.error = UpstreamError(message, got_bytes=self.got_bytes, left=left, lost=lost)
        self._fail(message)

    def on_timeout(self) -> None:
        """The first-byte deadline passed (called by the pool's sweep)."""
        self.watched = False
        if self.waiter is not None and not self.waiter.done() and self.body_len == 0:
            self._fail("engine sent no token before the first-token timeout", timeout=True)
            self.close()

    def _fail(self, message: str, *, timeout: bool = False, stalled: bool = False) -> None:
        if self.error is None:
            self.error = UpstreamError(message, got_bytes=self.got_bytes, timeout=timeout, stalled=stalled)
        if self.ep_key is not None:
            self.pool.exchanges.ended(self)
        self._unwatch()
        if self.stall_watched:
            self._unwatch_stall()
        w = self.waiter
        if w is not None and not w.done():
            w.set_exception(self.error)
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.abort()


def _ignore(_: bytes) -> None:
    return None
