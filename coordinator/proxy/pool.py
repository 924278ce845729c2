"""Talking to engines over keep-alive connections: the pool (idle connections per address,
and the sweeps that time exchanges out: no first byte within the first-token timeout, or a
committed stream silent for the inter-token timeout, `UpstreamConn.on_timeout` / `on_stall`),
and `Upstreams`, which opens an exchange over it (surviving a stale pooled connection),
fetches a whole body (a prefill leg) and sends best-effort aborts.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from coordinator.endpoint import Endpoint
from coordinator.proxy.exchanges import Exchanges
from coordinator.proxy.upstream import UpstreamConn, UpstreamError

log = logging.getLogger(__name__)

# How often first-byte deadlines are checked: a per-request timer handle costs more than the
# whole routing decision, a table swept a few times a second costs nothing per request.
SWEEP_INTERVAL = 0.05
# Streams are checked for silence at most this often (and 4 times per inter-token timeout):
# the check compares body lengths, so a token costs nothing, only the sweep does.
STALL_SWEEP_MAX = 1.0


class UpstreamPool:
    """Idle keep-alive connections per (host, port); a connection serves one exchange at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *, max_idle_per_host: int = 256) -> None:
        self.loop = loop
        self.max_idle = max_idle_per_host
        self.idle: dict[tuple[str, int], list[UpstreamConn]] = {}
        self.connect_timeout = 5.0
        self.first_byte: dict[UpstreamConn, float] = {}  # exchange -> first-byte deadline
        self._sweeper: asyncio.TimerHandle | None = None
        # Committed streams -> [body length at the last look, when it last grew].
        self.inter_token_timeout: float | None = None
        self.streaming: dict[UpstreamConn, list[float]] = {}
        self._stall_sweeper: asyncio.TimerHandle | None = None
        self.exchanges = Exchanges()  # every exchange under way, by endpoint

    def watch_stall(self, conn: UpstreamConn) -> None:
        """Fail `conn`'s stream if it goes silent for the inter-token timeout (if one is set)."""
        timeout = self.inter_token_timeout
        if timeout is None:
            return
        conn.stall_watched = True
        self.streaming[conn] = [conn.body_len, self.loop.time()]
        if self._stall_sweeper is None:
            self._stall_sweeper = self.loop.call_later(min(STALL_SWEEP_MAX, timeout / 4), self._sweep_stalls)

    def _sweep_stalls(self) -> None:
        timeout = self.inter_token_timeout
        assert timeout is not None
        now = self.loop.time()
        late: list[tuple[UpstreamConn, float]] = []
        for c, seen in self.streaming.items():
            if c.body_len != seen[0] or c.paused:
                seen[0], seen[1] = c.body_len, now  # a token arrived, or a slow client holds it
            elif now - seen[1] >= timeout:
                late.append((c, now - seen[1]))
        for c, silent in late:
            del self.streaming[c]
            c.on_stall(silent)
        self._stall_sweeper = (
            self.loop.call_later(min(STALL_SWEEP_MAX, timeout / 4), self._sweep_stalls)
            if self.streaming
            else None
        )

    def watch(self, conn: UpstreamConn, timeout: float) -> None:
        """Fail `conn`'s exchange if no body byte arrives within `timeout` seconds."""
        self.first_byte[conn] = self.loop.time() + timeout
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(SWEEP_INTERVAL, self._sweep)

    def _sweep(self) -> None:
        now = self.loop.time()
        late = [c for c, deadline in self.first_byte.items() if deadline <= now]
        for c in late:
            del self.first_byte[c]
            c.on_timeout()
        self._sweeper = self.loop.call_later(SWEEP_INTERVAL, self._sweep) if self.first_byte else None

    def take(self, host: str, port: int) -> UpstreamConn | None:
        """An idle connection to host:port, if there is one."""
        stack = self.idle.get((host, port))
        while stack:
            conn = stack.pop()
            if not conn.closed:
                return conn
        return None

    async def connect(self, host: str, port: int) -> UpstreamConn:
        """A fresh connection (never from the pool)."""
        key = (host, port)
        try:
            _, proto = await asyncio.wait_for(
                self.loop.create_connection(lambda: UpstreamConn(self, key), host, port),
                self.connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            raise UpstreamError(f"cannot connect to engine {host}:{port}: {exc}") from None
        assert isinstance(proto, UpstreamConn)
        return proto

    def put(self, conn: UpstreamConn) -> None:
        """Keep an idle connection for the next exchange (closed beyond `max_idle`)."""
        stack = self.idle.setdefault(conn.key, [])
        if len(stack) < self.max_idle:
            stack.append(conn)
        else:
            conn.close()

    def forget(self, conn: UpstreamConn) -> None:
        """`conn` closed: it is no idle connection any more."""
        stack = self.idle.get(conn.key)
        if stack and conn in stack:
            stack.remove(conn)

    def close(self) -> None:
        """Close every idle connection (and stop sweeping deadlines)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._stall_sweeper is not None:
            self._stall_sweeper.cancel()
            self._stall_sweeper = None
        for stack in self.idle.values():
            for conn in list(stack):
                conn.close()
        self.idle.clear()


def request_head(ep: Endpoint, path: bytes, length: int, request_id: str) -> bytes:
    """The head of a POST to an engine (our own minimal header set)."""
    return (
        b"POST %b HTTP/1.1\r\nhost: %b:%d\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nx-request-id: %b\r\n\r\n"
        % (path, ep.host.encode(), ep.port, length, request_id.encode())
    )


class Upstreams:
    """Opens exchanges with engines over the shared keep-alive pool."""

    def __init__(
        self, pool: UpstreamPool, *, first_token_timeout: float, inter_token_timeout: float | None = None
    ) -> None:
        self.pool = pool
        self.first_token_timeout = first_token_timeout
        pool.inter_token_timeout = inter_token_timeout
        self._background: set[asyncio.Task[Any]] = set()

    async def open(self, ep: Endpoint, path: bytes, body: bytes, request_id: str) -> UpstreamConn:
        """Send a request; return once the engine sent its head and first body bytes.

        A pooled connection the engine closed meanwhile fails without a byte: that one case
        is retried once on a fresh connection (the request cannot have been seen).
        """
        data = request_head(ep, path, len(body), request_id) + body
        pool = self.pool
        conn = pool.take(ep.host, ep.port) or await pool.connect(ep.host, ep.port)
        pool.exchanges.started(conn, ep.key, request_id)
        try:
            await conn.send(data, self.first_token_timeout)
            return conn
        except UpstreamError as exc:
            if not (conn.reused and not exc.got_bytes and not exc.timeout) or exc.left or exc.lost:
                raise
        except BaseException:
            conn.close()
            raise
        conn = await pool.connect(ep.host, ep.port)
        pool.exchanges.started(conn, ep.key, request_id)
        try:
            await conn.send(data, self.first_token_timeout)
        except BaseException:
            conn.close()
            raise
        return conn

    async def fetch(self, ep: Endpoint, path: bytes, body: bytes, request_id: str) -> tuple[int, bytes]:
        """A whole exchange: (status, decoded body)."""
        conn = await self.open(ep, path, body, request_id)
        try:
            data = await conn.read_all()
        except BaseException:
            conn.close()
            raise
        status = conn.status
        conn.release()
        return status, data

    def leave(self, key: str, why: str) -> int:
        """Endpoint `key` left routing: every exchange on it ends now (`Exchanges.leave`)."""
        return self.pool.exchanges.leave(key, why)

    def abort(self, ep: Endpoint, request_id: str) -> None:
        """Best effort `POST /abort_request` in the background (SGLang's native abort)."""
        task = asyncio.get_running_loop().create_task(self._abort(ep, request_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort(self, ep: Endpoint, request_id: str) -> None:
        body = orjson.dumps({"rid": request_id})
        try:
            status, _ = await asyncio.wait_for(self.fetch(ep, b"/abort_request", body, request_id), 5.0)
            log.debug("abort %s on %s: HTTP %d", request_id, ep.key, status)
        except (UpstreamError, TimeoutError) as exc:
            log.info("abort %s on %s failed: %s", request_id, ep.key, exc)

    async def close(self) -> None:
        """Wait for pending aborts (briefly) and close idle connections."""
        if self._background:
            await asyncio.wait(list(self._background), timeout=2.0)
        self.pool.close()
