"""The coordinator process: follow the log into the routing table, serve /v1 and management.

One `AsyncExitStack`-style lifecycle: connect to NATS, ensure the streams, follow MOTOR
(events) and MOTOR_HB (heartbeats) into the context's table (`coordinator.feed`, through
outages, poison events and a lost log), then listen. The table is caught up once both
streams are replayed to what existed at start.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from dataclasses import dataclass

from nats.aio.client import Client
from nats.js import JetStreamContext

from coordinator.breaker import Breakers, BreakerState, CircuitChange
from coordinator.choose import Chooser
from coordinator.context import CoordinatorContext
from coordinator.faultlog import FaultLog, FaultOutbox
from coordinator.feed import follow_log
from coordinator.kvfeed import KvFeed
from coordinator.metrics import BREAKER_CLOSED, BREAKER_HALF_OPEN, BREAKER_OPEN
from coordinator.mgmt import create_mgmt_app, mgmt_access
from coordinator.policies import Policy, make_policy
from coordinator.proxy.admit import Admission
from coordinator.proxy.app import ProxyApp
from coordinator.proxy.asgi import ASGIApp, Lifespan
from coordinator.proxy.attempts import Attempts
from coordinator.proxy.hedge import Hedger
from coordinator.proxy.legs import Legs
from coordinator.proxy.mgmtport import mgmt_head, start_mgmt_server, start_mgmt_unix
from coordinator.proxy.pipeline import Pipeline
from coordinator.proxy.pool import UpstreamPool, Upstreams
from coordinator.proxy.precision import PrecisionHook
from coordinator.proxy.record import Recorder
from coordinator.proxy.server import ProxyServer
from coordinator.ratelimit import RateLimiter
from coordinator.table import Incarnation
from core.coordconfig import CoordinatorConfig
from core.events import Role
from core.kvblocks import KvView
from http1.auth import Guard
from http1.metrics import HttpCollector
from streams.connection import NatsOptions, connect
from streams.definitions import ensure_streams
from streams.jetstream import JetStreamLog
from streams.livefold import LiveFold
from streams.publisher import Publisher

log = logging.getLogger(__name__)

_BREAKER_GAUGE = {
    BreakerState.CLOSED: BREAKER_CLOSED,
    BreakerState.HALF_OPEN: BREAKER_HALF_OPEN,
    BreakerState.OPEN: BREAKER_OPEN,
}


def make_policies(settings: CoordinatorConfig, kv: KvView | None = None) -> dict[Role, Policy]:
    """One policy object per role, as the config names them, over the folded KV view."""
    p = settings.policy
    return {
        Role.UNION: make_policy(p.union, kv),
        Role.PREFILL: make_policy(p.prefill, kv),
        Role.DECODE: make_policy(p.decode, kv),
    }


@dataclass
class Proxy:
    """The /v1 handler and the parts the service must close: engine pool, fault log, outbox."""

    app: ProxyApp
    ups: Upstreams
    faults: FaultLog | None
    outbox: FaultOutbox | None

    async def close(self) -> None:
        """Close engine connections; flush the fault log and give its outbox a moment."""
        await self.ups.close()
        if self.faults is not None:
            self.faults.flush()
        if self.outbox is not None:
            await self.outbox.close()


def build_proxy(
    ctx: CoordinatorContext, *, mgmt_app: ASGIApp | None = None, name: str = "coordinator"
) -> Proxy:
    """The /v1 handler over `ctx`: breakers wired into the table, the metrics and the fault log
    (whose outbox appends circuit and stream events when `ctx` has a publisher)."""
    s = ctx.settings
    metrics = ctx.metrics
    table = ctx.table
    outbox = FaultOutbox(ctx.publisher, metrics=metrics) if ctx.publisher is not None else None
    faults = FaultLog(table, outbox.post, coordinator=name, source=ctx.source) if outbox is not None else None

    def on_change(change: CircuitChange) -> None:
        key, state = change.key, change.state
        ep = table.endpoint(key)
        role = ep.role.value if ep is not None else ""
        metrics.breaker_state.labels(endpoint=key, role=role).set(_BREAKER_GAUGE[state])
        if state == BreakerState.OPEN:
            metrics.breaker_trips.labels(endpoint=key, role=role).inc()
            log.warning(
                "circuit of %s opened for %.0f s after %d failures (seq %d): %s",
                key,
                change.backoff,
                change.failures,
                table.last_seq,
                change.reason,
            )
        else:
            log.info("circuit of %s closed: %s", key, change.reason)
        if faults is not None:
            faults.circuit(change)
        if state == BreakerState.OPEN:
            metrics.moved.inc(ups.leave(key, f"its circuit opened: {change.reason}"))

    breakers = Breakers(
        failures=s.breaker.failures,
        backoff_initial=s.breaker.backoff_initial,
        backoff_max=s.breaker.backoff_max,
        on_change=on_change,
    )
    table.is_open = breakers.is_open
    table.breaker_idle = breakers.idle

    def on_incarnation(key: str, inc: Incarnation) -> None:
        # The circuit was the old process's: the new one starts clean, routable at once.
        if breakers.state(key) != BreakerState.CLOSED:
            ep = table.endpoint(key)
            metrics.breaker_resets.labels(endpoint=key, role=ep.role.value if ep is not None else "").inc()
        breakers.reset(key, f"new incarnation ({inc.describe()})")

    table.on_incarnation = on_incarnation
    ups = Upstreams(
        UpstreamPool(asyncio.get_running_loop()),
        first_token_timeout=s.first_token_timeout,
        inter_token_timeout=s.inter_token_timeout,
    )

    def on_leave(key: str, why: str) -> None:
        metrics.moved.inc(ups.leave(key, why))

    table.on_leave = on_leave
    table.schedule = asyncio.get_running_loop().call_soon
    legs = Legs(ups, breakers, metrics=metrics, faults=faults)
    chooser = Chooser(table, make_policies(s, ctx.kv))
    hedger = Hedger(s.hedge, s.first_token_timeout, lose=ups.pool.exchanges.lose, metrics=metrics)
    attempts = Attempts(
        table, chooser, legs, retries=s.retries, metrics=metrics, faults=faults, hedger=hedger
    )
    guard = Guard(s.api_keys, s.admin_keys, admin_field="coordinator.admin_keys")
    rl = s.rate_limit
    admission = Admission(
        table,
        guard,
        limiter=RateLimiter(rl) if rl.requests_per_second or rl.max_in_flight else None,
        metrics=metrics,
        continue_whole_from=s.continue_whole_from_tokens,
    )
    dc = s.decisions
    recorder = Recorder(
        name, ring=dc.ring, sample=dc.sample, slow=dc.slow_s, post=outbox.post if outbox is not None else None
    )
    ctx.recorder = recorder
    pipeline = Pipeline(
        table,
        admission,
        attempts,
        metrics=metrics,
        on_done=PrecisionHook(ctx) if s.precision_detector.enabled else None,
        request_timeout=s.request_timeout,
        recorder=recorder,
    )
    app = ProxyApp(
        pipeline,
        table,
        guard,
        metrics=metrics,
        mgmt_app=mgmt_app,
        mgmt_probes_only=s.mgmt_port is not None,
        mgmt_access=mgmt_access(s),
    )
    return Proxy(app, ups, faults, outbox)


class CoordinatorService:
    """A running coordinator: NATS followers, the table, and the HTTP server on one port."""

    def __init__(
        self,
        settings: CoordinatorConfig,
        nats: NatsOptions | str | list[str],
        *,
        host: str | None = None,
        port: int | None = None,
        mgmt_port: int | None = None,
        name: str = "coordinator",
        reuse_port: bool = False,
        probe_socket: str | None = None,
    ) -> None:
        self.settings = settings
        self.nats = nats
        self.host = host if host is not None else settings.host
        self.want_port = port if port is not None else settings.port
        if mgmt_port is not None:
            self.settings = settings.model_copy(update={"mgmt_port": mgmt_port})
        self.name = name
        self.reuse_port = reuse_port  # replicas on one port: the kernel spreads connections
        # This replica's own management listener, for its supervisor's liveness probe.
        self.probe_socket = probe_socket
        self.probe_server: ProxyServer | None = None
        self.ctx: CoordinatorContext | None = None
        self.server: ProxyServer | None = None
        self.mgmt_server: ProxyServer | None = None
        self._nc: Client | None = None
        self._fold: LiveFold | None = None  # made in start()
        self._kvfeed: KvFeed | None = None
        self._lifespan: Lifespan | None = None
        self._proxy: Proxy | None = None

    @property
    def port(self) -> int:
        """The port the server listens on."""
        assert self.server is not None
        return self.server.port

    async def start(self) -> None:
        """Connect, ensure streams, start following the log and listen."""
        self._nc = await connect(self.nats, name=self.name, retry_initial=True)
        js: JetStreamContext = self._nc.jetstream()
        await ensure_streams(js, update=False)  # the controller owns the streams' settings
        ctx = self.ctx = CoordinatorContext(
            settings=self.settings, publisher=Publisher(js), source=f"coordinator/{self.name}"
        )
        self._fold = follow_log(ctx, JetStreamLog(self._nc), name=f"coordinator/{self.name}")
        await self._fold.start()
        self._kvfeed = KvFeed(ctx.kv, JetStreamLog(self._nc))
        self._kvfeed.start()
        mgmt = create_mgmt_app(ctx)
        self._lifespan = Lifespan(mgmt)
        await self._lifespan.start()
        self._proxy = build_proxy(ctx, mgmt_app=mgmt, name=self.name)
        limits = self.settings.http
        if self.reuse_port:
            # Sharing the port, a replica takes connections the moment it listens: it joins
            # once its table holds the log, or a restarted one would answer 503 meanwhile.
            await ctx.caught_up.wait()
        if self.probe_socket is not None:
            # Before the shared port: a replica that answers here is judged by its silence,
            # so it must answer before it can swallow a connection (`deploy.liveness`).
            self.probe_server = await start_mgmt_unix(
                mgmt, self.probe_socket, max_body=self.settings.max_body_bytes, limits=limits
            )
            log.info("coordinator liveness and management on the unix socket %s", self.probe_socket)
        app = self._proxy.app
        self.server = ProxyServer(
            app, max_body=self.settings.max_body_bytes, limits=limits, head_check=app.head
        )
        await self.server.start(self.host, self.want_port, reuse_port=self.reuse_port)
        log.info("coordinator listening on http://%s:%d", self.host, self.port)
        http = HttpCollector("motor_coordinator")
        assert self.server.watchdog is not None
        http.add(self.server.watchdog)
        if self.settings.mgmt_port is not None:  # seed 001: the manage port
            mp = self.settings.mgmt_port
            self.mgmt_server = await start_mgmt_server(
                mgmt,
                self.host,
                mp,
                max_body=self.settings.max_body_bytes,
                limits=limits,
                reuse_port=self.reuse_port,
                head_check=mgmt_head(app.guard, mgmt_access(self.settings)),
            )
            assert self.mgmt_server.watchdog is not None
            http.add(self.mgmt_server.watchdog)
            log.info("coordinator management API on http://%s:%d", self.host, self.mgmt_server.port)
        ctx.metrics.registry.register(http)

    async def drain(self) -> None:
        """Go away gracefully: not ready from now on, no new connection, every request under
        way answered (for at most `drain_timeout`), then `stop`."""
        within = self.settings.drain_timeout
        if self.ctx is not None:
            self.ctx.draining = True
        if self.server is not None and within > 0:
            busy = sum(1 for c in self.server.conns if c.busy())
            log.info("draining: %d request(s) under way, for at most %g s", busy, within)
            cut = await self.server.drain(within)
            if cut:
                log.warning("drained for %g s: %d connection(s) still busy were cut", within, cut)
            else:
                log.info("drained: every request under way was answered")
        await self.stop()

    async def stop(self) -> None:
        """Stop listening, stop following, close NATS."""
        if self.server is not None:
            await self.server.stop()
        if self.mgmt_server is not None:
            await self.mgmt_server.stop()
        if self.probe_server is not None:
            await self.probe_server.stop()
            assert self.probe_socket is not None
            with contextlib.suppress(OSError):
                os.unlink(self.probe_socket)
        if self._proxy is not None:
            await self._proxy.close()
        if self._fold is not None:
            with contextlib.suppress(Exception):
                await self._fold.close()
        if self._kvfeed is not None:
            await self._kvfeed.close()
        if self._lifespan is not None:
            await self._lifespan.stop()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.drain()


async def run(service: CoordinatorService, stop: asyncio.Event) -> None:
    """Start, serve until `stop` is set, then shut down."""
    await service.start()
    # What start-up made (modules, the apps, the table) lives as long as the process: frozen,
    # the cyclic collector no longer walks it on every full pass, which under thousands of
    # connections was a stall of the event loop each time.
    gc.freeze()
    try:
        await stop.wait()
    except BaseException:
        await service.stop()
        raise
    await service.drain()
