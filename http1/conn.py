"""A server connection read within `HttpLimitsConfig`, and the watchdog that sweeps them all.

`LimitedProtocol` owns the transport, the httptools parser and the head reader;
`server.ClientConn` serves the requests (`on_body`, `on_message_complete`, the handler) and
shapes error bodies (`error_response`). The `Watchdog` (one a server) admits connections up
to the cap, and sweeps a few times a second for heads that take too long (408), bodies that
take too long (408: the deadline runs from the end of the head, so a trickle does not reset
it) and keep-alive connections idle too long (closed): a table swept costs nothing per
request, a timer per connection would.

A connection is *trusted* once one of its request heads passed the server's head check with
a key (or, where no key is configured, once it completed a head at all). At the cap a new
connection is not refused while an untrusted one is open: the oldest untrusted connection is
answered 503 and closed instead, so connections that never presented a key (a slowloris,
anonymous trickles) cannot lock keyed clients out; only when every slot is trusted is the
newcomer answered 503.

A client's EOF closes its connection (asyncio's default): a client that goes away aborts its
request, which is how an engine learns to stop generating for it.

A refused or rejected connection is closed lingering: the answer goes out, our side shuts
its writing half, and what the client still sends is read and dropped for a moment, so its
kernel does not reset the connection before it read the answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import socket
from typing import cast

import httptools

from core.coordconfig import HttpLimitsConfig
from http1.head import HeadReader, LimitExceeded

log = logging.getLogger(__name__)

LINGER = 2.0  # seconds a rejected connection is drained before it is closed
_FD_RESERVE = 256  # descriptors kept for everything that is not a client connection
SWEEP_BATCH = 128  # timed-out connections ended per turn of the event loop


class LimitedProtocol(asyncio.Protocol):
    """One client connection whose request heads are read within the server's limits."""

    def __init__(self, watchdog: Watchdog) -> None:
        self.watchdog = watchdog
        self.limits = watchdog.limits
        self.loop = watchdog.loop
        self.transport: asyncio.Transport | None = None
        # The parser holds this protocol's callbacks: a cycle, let go of at connection_lost so
        # a closed connection is freed by reference counting, not by the cyclic collector
        # (whose full passes over thousands of churned connections stalled the loop ~1 s).
        self.parser: httptools.HttpRequestParser | None = httptools.HttpRequestParser(self)
        self.head = HeadReader(self.limits)
        self.idle_since: float | None = None  # waiting for the client's bytes since (idle timeout)
        self.body_since: float | None = None  # the current body is owed since (body deadline)
        self.write_stalled_since: float | None = None  # the client has not read since (its socket full)
        self.trusted = False  # a head passed with a key: never evicted at the cap
        self.lingering = False
        self.closed = False
        # A rejection waiting for earlier answers: (status, message, code, extra headers).
        self._deferred: tuple[int, str, str, list[tuple[bytes, bytes]] | None] | None = None

    # ------------------------------------------------------------------ for subclasses

    def error_response(
        self, status: int, message: str, code: str, extra: list[tuple[bytes, bytes]] | None = None
    ) -> bytes:
        """A complete `connection: close` response carrying this server's error body."""
        raise NotImplementedError

    def headers_done(self, headers: dict[bytes, bytes]) -> None:
        """The head of a request was read; `headers` has lower-case names. Raising
        `LimitExceeded` refuses the request before any byte of its body is read."""

    def busy(self) -> bool:
        """Whether a request is being served or waits its turn."""
        raise NotImplementedError

    def request_served(self) -> None:
        """Call when a response is finished and nothing else is queued: the idle timer starts."""
        if self._deferred is not None:
            status, message, code, extra = self._deferred
            self._deferred = None
            self.reject(status, message, code, extra)
        elif self.head.since is None and not self.closed:
            self.idle_since = self.loop.time()

    # ------------------------------------------------------------------ transport

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not self.watchdog.admit(self):
            self.watchdog.at_cap()
            self.reject(
                503,
                f"the server is at its limit of {self.limits.max_connections} connections; retry later",
                "too_many_connections",
            )
            return
        self.head.since = self.loop.time()  # a new connection owes a head within the timeout

    def data_received(self, data: bytes) -> None:
        if self.lingering or self._deferred is not None or self.parser is None:
            return
        try:
            self.head.feed(self.parser, data)
        except LimitExceeded as exc:
            self.reject(exc.status, exc.message, exc.code, exc.headers)
        except httptools.HttpParserUpgrade:
            self.reject(400, "protocol upgrades are not supported", "upgrade_not_supported")
        except httptools.HttpParserError as exc:
            self.reject(400, f"malformed HTTP request: {exc}", "malformed_request")

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.parser = None
        self.watchdog.drop(self)

    # ------------------------------------------------------------------ parser callbacks

    def on_message_begin(self) -> None:
        self.idle_since = None
        self.head.begin(self.loop.time())

    def on_url(self, url: bytes) -> None:
        self.head.on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head.on_header(name, value)

    def on_headers_complete(self) -> None:
        headers = self.head.complete()
        # Until the body has arrived: a bodiless request completes within this same feed,
        # before any sweep can see it.
        self.idle_since = self.body_since = self.loop.time()
        self.headers_done(headers)

    def on_body(self, body: bytes) -> None:
        self.idle_since = self.loop.time()  # a stall; the deadline (`body_since`) stays

    def on_message_complete(self) -> None:
        self.idle_since = self.body_since = None
        self.head.message_done()

    def trust(self) -> None:
        """A head passed with a key (or no key is configured): never evicted at the cap."""
        if not self.trusted:
            self.trusted = True
            self.watchdog.trust(self)

    # ------------------------------------------------------------------ ending

    def on_timeout(self, kind: str) -> None:
        """The watchdog's verdict: `header` (too slow a head), `body` (too slow a body), `write`
        (the client reads nothing of its response) or `idle` (nothing sent)."""
        if kind == "header":
            self.reject(
                408, f"request head not received within {self.limits.header_timeout:g} s", "header_timeout"
            )
        elif kind == "body":
            self.reject(
                408, f"request body not received within {self.limits.body_timeout:g} s", "body_deadline"
            )
        elif kind == "write":  # mid-response: a client that reads nothing is cut (its request ends)
            log.info("a client read nothing for %g s: connection cut", self.limits.write_stall_timeout)
            self.watchdog.rejected(408, "write_stall")
            self.closed = True
            if self.transport is not None:
                self.transport.abort()
        elif self.head.in_head:
            self.close()  # an idle keep-alive connection: nothing is owed
        else:
            self.reject(408, f"request body stalled for {self.limits.idle_timeout:g} s", "body_timeout")

    def reject(
        self, status: int, message: str, code: str, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        """Answer `status` with an error body (and `extra` headers) and close lingering; the
        request is not served."""
        t = self.transport
        if t is None or self.closed or self.lingering:
            return
        if self.busy():
            # Requests before this one are answered first, in order; this answer follows them.
            if self._deferred is None:
                self._deferred = (status, message, code, extra)
                self.head.since = None
                self.idle_since = self.body_since = None
                t.pause_reading()
            return
        self.lingering = True
        self.idle_since = self.body_since = None
        self.head.since = None
        self.watchdog.rejected(status, code)
        t.write(self.error_response(status, message, code, extra))
        self.watchdog.linger(t)

    def close(self) -> None:
        """Close after what was written is flushed."""
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.close()


class Watchdog:
    """Admission (the cap) and the timeout sweep of one server's connections."""

    def __init__(
        self, limits: HttpLimitsConfig, loop: asyncio.AbstractEventLoop, *, fds_per_conn: int = 1
    ) -> None:
        self.limits = limits
        self.loop = loop
        self.cap = fit_cap(limits.max_connections, fds_per_conn)
        self.conns: set[LimitedProtocol] = set()
        # The open connections not trusted yet, oldest first: the ones evicted at the cap.
        self.untrusted: dict[LimitedProtocol, None] = {}
        self.refused = 0  # connections refused at the cap
        self.evicted = 0  # untrusted connections closed to make room at the cap
        self.rejects: dict[tuple[int, str], int] = {}  # (status, code) -> count, for metrics
        self._cap_logged_at = -1e9
        self._lingering: dict[asyncio.Transport, float] = {}
        shortest = min(
            limits.header_timeout, limits.idle_timeout, limits.body_timeout, limits.write_stall_timeout
        )
        self._tick = min(max(shortest / 4, 0.05), 1.0)
        self._sweeper: asyncio.TimerHandle | None = None

    def admit(self, conn: LimitedProtocol) -> bool:
        """Take `conn` in (untrusted), evicting the oldest untrusted connection at the cap;
        False when every slot is held by a trusted connection."""
        if len(self.conns) >= self.cap and not self._evict():
            return False
        self.conns.add(conn)
        self.untrusted[conn] = None
        self._arm()
        return True

    def trust(self, conn: LimitedProtocol) -> None:
        """`conn` presented a key: it is no longer a candidate for eviction."""
        self.untrusted.pop(conn, None)

    def _evict(self) -> bool:
        """Make room for one connection by ending the oldest untrusted one (False: none)."""
        while self.untrusted:
            victim = next(iter(self.untrusted))
            del self.untrusted[victim]
            if victim not in self.conns:
                continue
            self.conns.discard(victim)  # its slot is free now, whenever its transport closes
            self.evicted += 1
            self._log_cap()
            t = victim.transport
            if victim.lingering or victim.closed or victim.busy() or t is None:
                # Already answered, or serving an anonymous request: it owes nothing more.
                victim.closed = True
                if t is not None:
                    self._lingering.pop(t, None)
                    t.abort()
            else:
                victim.reject(
                    503,
                    f"the server is at its limit of {self.limits.max_connections} connections and "
                    "makes room for clients with a key; retry later",
                    "connection_evicted",
                )
            return True
        return False

    def drop(self, conn: LimitedProtocol) -> None:
        """`conn` is gone."""
        self.conns.discard(conn)
        self.untrusted.pop(conn, None)
        if conn.transport is not None:
            self._lingering.pop(conn.transport, None)

    def rejected(self, status: int, code: str) -> None:
        """Count a refusal by status and code (`http1.metrics`)."""
        key = (status, code)
        self.rejects[key] = self.rejects.get(key, 0) + 1
        log.debug("refused a request: %d %s", status, code)

    def at_cap(self) -> None:
        """A connection came in with every slot trusted: counted, and logged (`_log_cap`)."""
        self.refused += 1
        self._log_cap()

    def _log_cap(self) -> None:
        """One line at most every 10 s while connections meet the cap."""
        now = self.loop.time()
        if now - self._cap_logged_at >= 10.0:
            log.warning(
                "connection cap of %d reached: %d connections refused (503), %d untrusted evicted so far",
                self.cap, self.refused, self.evicted,
            )  # fmt: skip
            self._cap_logged_at = now

    def linger(self, transport: asyncio.Transport) -> None:
        """Shut our writing half now, drop what the client still sends, close within `LINGER`."""
        if len(self._lingering) >= max(256, self.cap):
            transport.close()  # too many already: close at once rather than hold descriptors
            return
        with contextlib.suppress(OSError, RuntimeError, AttributeError, NotImplementedError):
            if transport.can_write_eof():
                transport.write_eof()
        with contextlib.suppress(OSError, RuntimeError, AttributeError):
            transport.resume_reading()
        self._lingering[transport] = self.loop.time() + LINGER
        self._arm()

    def close_all(self) -> None:
        """Abort every connection (server shutdown)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for t in list(self._lingering):
            t.abort()
        self._lingering.clear()
        for c in list(self.conns):
            c.closed = True
            if c.transport is not None:
                c.transport.abort()
        self.conns.clear()
        self.untrusted.clear()

    def _arm(self) -> None:
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(self._tick, self._sweep)

    def _sweep(self) -> None:
        now = self.loop.time()
        self._expire([c for c in self.conns if self._due(c, now) is not None], now)
        for t, deadline in list(self._lingering.items()):
            if deadline <= now:
                del self._lingering[t]
                t.close()
        busy = self.conns or self._lingering
        self._sweeper = self.loop.call_later(self._tick, self._sweep) if busy else None

    def _due(self, c: LimitedProtocol, now: float) -> str | None:
        """Which timeout `c` has run out of at `now`, if any."""
        if c.lingering or c.closed:
            return None
        since = c.head.since
        if since is not None and since < now - self.limits.header_timeout:
            return "header"
        if c.body_since is not None and c.body_since < now - self.limits.body_timeout:
            return "body"
        if (
            c.write_stalled_since is not None
            and c.write_stalled_since < now - self.limits.write_stall_timeout
        ):
            return "write"
        if c.idle_since is not None and c.idle_since < now - self.limits.idle_timeout:
            return "idle"
        return None

    def _expire(self, due: list[LimitedProtocol], now: float) -> None:
        """End `SWEEP_BATCH` of the connections `due`, the rest after the loop's other work:
        thousands of slow connections timing out together must not stall serving."""
        for c in due[:SWEEP_BATCH]:
            kind = self._due(c, now)  # it may have caught up, or gone, meanwhile
            if kind is not None:
                c.on_timeout(kind)
        if len(due) > SWEEP_BATCH:
            self.loop.call_soon(self._expire, due[SWEEP_BATCH:], now)


def fit_cap(want: int, fds_per_conn: int) -> int:
    """The connection cap this process can keep: raises the soft descriptor limit toward what
    `want` connections need, and lowers the cap (with a warning) where the hard limit is short."""
    need = want * fds_per_conn + _FD_RESERVE
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < need:
            target = need if hard == resource.RLIM_INFINITY else min(need, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    except (OSError, ValueError) as exc:
        log.warning("cannot raise the descriptor limit: %s", exc)
        return want
    if soft == resource.RLIM_INFINITY or soft >= need:
        return want
    cap = max(1, (soft - _FD_RESERVE) // fds_per_conn)
    log.warning(
        "connection cap lowered from %d to %d: the descriptor limit is %d (raise `ulimit -n`)",
        want,
        cap,
        soft,
    )
    return cap
