"""The engine exchanges an attempt is made of: a prefill leg fetched whole, or a leg whose
answer is delivered to the client (`deliver.py`), with the breaker and the metrics told how
each engine did. A P/D adapter (`coordinator.adapters`) combines them; a single hop is one
delivered leg.

An `Attempt` is one try of a request on one candidate; it carries its engine request id, so
every leg, abort and bootstrap room of it names the same id (`{root}#a{n}`). A failure before
anything reached the client is a `Retry` naming the endpoint; a failure after is `Broken`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from time import perf_counter
from typing import Any

from coordinator.breaker import Breakers
from coordinator.endpoint import Endpoint
from coordinator.faultlog import FaultLog
from coordinator.metrics import CoordinatorMetrics
from coordinator.proxy.ask import Ask
from coordinator.proxy.deliver import Delivery, deliver, read_whole
from coordinator.proxy.hedge import Hedger, Race
from coordinator.proxy.outcome import Retry
from coordinator.proxy.pool import Upstreams
from coordinator.proxy.upstream import UpstreamError

# What a leg that lost its request's hedge race failed with (shared: it carries no detail).
LOST = UpstreamError("a hedge of this request answered first", lost=True)


class Legs:
    """Talks to engines for attempts; the breaker and the metrics hear every outcome."""

    def __init__(
        self,
        ups: Upstreams,
        breakers: Breakers,
        *,
        metrics: CoordinatorMetrics | None = None,
        faults: FaultLog | None = None,
    ) -> None:
        self.ups = ups
        self.breakers = breakers
        self.metrics = metrics
        self.faults = faults
        self._background: set[asyncio.Task[Any]] = set()

    async def prefill(self, at: Attempt, p: Endpoint, body: bytes) -> tuple[int, bytes]:
        """A prefill leg, whole, counted in flight on `p`; Retry on a transport error or a 5xx."""
        self.breakers.on_attempt(p.key)
        try:
            with p.busy:
                status, data = await self.ups.fetch(p, at.ask.route.path, body, at.rid)
        except UpstreamError as exc:
            self.upstream_failed(p, exc)
            if exc.left or exc.lost:
                at.abort(p)
            raise Retry(f"prefill {p.key}: {exc}", 504 if exc.timeout else 502, ep=p, cause=exc) from None
        except asyncio.CancelledError:
            self.breakers.release_probe(p.key)
            raise
        if status >= 500:
            self.upstream_failed(p, None)
            raise Retry(f"prefill {p.key} answered HTTP {status}", status, data, ep=p)
        self.breakers.success(p.key)
        return status, data

    async def serve(self, at: Attempt, ep: Endpoint, body: bytes) -> None:
        """Send `body` to `ep` and deliver its answer to the client (the attempt loop counts
        `ep` in flight)."""
        br = self.breakers
        br.on_attempt(ep.key)
        try:
            up = await self.ups.open(ep, at.ask.route.path, body, at.rid)
        except UpstreamError as exc:
            self.upstream_failed(ep, exc)
            if exc.left or exc.lost:
                at.abort(ep)
            raise Retry(f"{ep.key}: {exc}", 504 if exc.timeout else 502, ep=ep, cause=exc) from None
        except asyncio.CancelledError:
            br.release_probe(ep.key)
            raise
        try:
            if up.status >= 500:
                data = await read_whole(up, ep)
                self.upstream_failed(ep, None)
                raise Retry(f"{ep.key} answered HTTP {up.status}", up.status, data, ep=ep)
            br.success(ep.key)
            h = at.hedger  # `at.claim(ep)`, inline: this is every request's
            if h is not None and not h.claim(at, ep):
                up.close()  # a hedge of this request answered first: this answer goes nowhere
                raise Retry(f"{ep.key}: a hedge of this request answered first", ep=ep, cause=LOST)
            if at.resuming is not None:
                if self.faults is not None:
                    self.faults.continued(at.resuming, ep.key)
                at.resuming = None
            await deliver(at.d, up, ep, at.prefill)
        except Retry as r:
            if r.cause is not None:  # the engine failed while its answer was read
                self.upstream_failed(ep, r.cause)
            raise

    def abort(self, ep: Endpoint, rid: str) -> None:
        """Ask `ep` to stop request `rid` (best effort, in the background)."""
        self.ups.abort(ep, rid)

    def keep(self, task: asyncio.Task[Any]) -> None:
        """Hold a leg no one awaits any more until it ends (its failure is only logged by its
        own code)."""
        if task.done():
            if not task.cancelled():
                task.exception()
            return
        self._background.add(task)
        task.add_done_callback(self._let_go)

    def _let_go(self, task: asyncio.Task[Any]) -> None:
        self._background.discard(task)
        if not task.cancelled():
            task.exception()

    def upstream_failed(self, ep: Endpoint, exc: UpstreamError | None) -> None:
        """Charge `ep`'s circuit and count the failure by kind (an exchange the coordinator
        ended itself, `left` or `lost`, is counted but charges nothing)."""
        kind = "http_5xx" if exc is None else exc.kind
        if exc is not None and (exc.left or exc.lost):
            self.breakers.release_probe(ep.key)
        else:
            self.breakers.failure(ep.key, f"{kind}: {exc}" if exc is not None else kind)
        if self.metrics is not None:
            self.metrics.upstream_errors.labels(endpoint=ep.key, kind=kind).inc()


class Attempt:
    """One try of a request on one candidate: what it sends, its engine request id and number,
    and its legs. Adapters see a request only through it (`adapters.base.PairAttempt`)."""

    __slots__ = (
        "ask", "body", "ctx", "d", "hedger", "legs", "number", "prefill", "race", "raw", "resuming", "rid", "t0",
    )  # fmt: skip

    def __init__(
        self,
        legs: Legs,
        d: Delivery,
        body: dict[str, Any],
        raw: bytes,
        number: int,
        *,
        prefill: Endpoint | None = None,
        resuming: str | None = None,
    ) -> None:
        self.legs = legs
        self.d = d
        self.ask: Ask = d.ask
        self.body = body  # the body this attempt sends (a continuation's after a break)
        self.raw = raw  # ... as bytes, for a single hop
        self.number = number
        self.rid = d.ask.request_id(number)
        self.prefill = prefill  # the candidate's prefill (P/D), whose peer the client's answer had
        self.resuming = resuming  # the endpoint a stream broke on, until this attempt carries it on
        # Hedging (`hedge.py`): the hedger watching it, its race with a hedge, when it began,
        # and what the attempt loop needs to make a hedge of it.
        self.hedger: Hedger | None = None
        self.race: Race | None = None
        self.t0 = perf_counter()  # when it began (the hedger's clock, and its record's)
        self.ctx: Any = None

    def claim(self, ep: Endpoint) -> bool:
        """This attempt's answer (from `ep`) came: whether it is the client's (it is, unless
        a hedge of the request answered first)."""
        h = self.hedger
        return True if h is None else h.claim(self, ep)

    @property
    def root(self) -> str:
        """The request's own id."""
        return self.ask.root

    @property
    def committed(self) -> bool:
        """Whether the client already got the head of an answer."""
        return self.d.committed

    # These two hand back the legs' coroutines rather than awaiting them: a coroutine frame
    # fewer per leg on the hot path.
    def prefill_leg(self, p: Endpoint, body: bytes) -> Coroutine[Any, Any, tuple[int, bytes]]:
        """The prefill leg of this attempt, whole."""
        return self.legs.prefill(self, p, body)

    def serve(self, ep: Endpoint, body: bytes) -> Coroutine[Any, Any, None]:
        """The leg whose answer the client gets."""
        return self.legs.serve(self, ep, body)

    def refused(self, status: int, body: bytes) -> None:
        """A leg refused the request itself (a 4xx): that is the client's answer."""
        self.d.relay_error(status, body)

    def abort(self, ep: Endpoint) -> None:
        """Ask `ep` to stop this attempt (best effort, in the background)."""
        self.legs.abort(ep, self.rid)

    def keep(self, task: asyncio.Task[Any]) -> None:
        """Hold a leg of this attempt no one awaits any more until it ends."""
        self.legs.keep(task)
