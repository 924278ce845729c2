"""The pool of keep-alive engine connections, and the sweeps that time their exchanges out:
no first byte within the first-token timeout, or a committed stream silent for the
inter-token timeout (`UpstreamConn.on_timeout` / `on_stall` fail the exchange).
"""

from __future__ import annotations

import asyncio

from coordinator.proxy.upstream import UpstreamConn, UpstreamError

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

    async def acquire(self, host: str, port: int) -> UpstreamConn:
        """An idle connection to host:port, or a new one."""
        key = (host, port)
        stack = self.idle.get(key)
        while stack:
            conn = stack.pop()
            if not conn.closed:
                return conn
        return await self.connect(host, port)

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
        stack = self.idle.setdefault(conn.key, [])
        if len(stack) < self.max_idle:
            stack.append(conn)
        else:
            conn.close()

    def forget(self, conn: UpstreamConn) -> None:
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
