"""One pipeline for every routed request, `/v1` and engine-native routes alike:
`admit` (keys, limits, rate, body, model: `admit.py`) → `plan` (what can serve the model on
this route: `RoutingTable.plan`) → the attempt loop (`attempts.py`) → `deliver` (one sink per
client protocol: `deliver.py`), then the request is observed once (metrics, the precision
hook). The request timeout ends it here too.

Each request's routing record (`record.py`) begins and ends here: the pipeline is the one
place that sees the admitted request, its plan, every attempt and how it ended.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from coordinator.metrics import CoordinatorMetrics
from coordinator.proxy.admit import Admission, Refused
from coordinator.proxy.attempts import Attempts
from coordinator.proxy.deliver import OPENAI, Anthropic, Delivery
from coordinator.proxy.record import Recorder
from coordinator.proxy.routes import ClientRoute
from coordinator.proxy.wholefold import WholeFold
from coordinator.table import RoutingTable
from core.http_errors import anthropic_error, openai_error
from http1.request import Request
from http1.server import ClientConn

log = logging.getLogger(__name__)

_SWEEP = 1.0  # seconds between request-timeout sweeps


class Pipeline:
    """Serves every request on a client route (`routes.ROUTES`)."""

    def __init__(
        self,
        table: RoutingTable,
        admission: Admission,
        attempts: Attempts,
        *,
        metrics: CoordinatorMetrics | None = None,
        on_done: Callable[[Delivery], None] | None = None,
        request_timeout: float | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.table = table
        self.admission = admission
        self.attempts = attempts
        self.metrics = metrics
        self.on_done = on_done  # called with each finished request (the precision detector)
        self.deadlines = Deadlines(request_timeout) if request_timeout is not None else None
        self.recorder = recorder

    async def serve(self, conn: ClientConn, req: Request, route: ClientRoute) -> None:
        """Admit, plan, attempt and deliver one request."""
        adm = self.admission
        refused = adm.gate(req, conn.max_body)
        if refused is not None:
            self.refuse(conn, req, route, refused)
            return
        limiter = adm.limiter
        if limiter is None:
            await self._admitted(conn, req, route)
            return
        try:
            await self._admitted(conn, req, route)
        finally:
            limiter.release()  # the slot `gate` took

    async def _admitted(self, conn: ClientConn, req: Request, route: ClientRoute) -> None:
        ask = self.admission.admit(conn, req, route)
        if isinstance(ask, Refused):
            self.refuse(conn, req, route, ask)
            return
        plan = self.table.plan(ask.model, route.serves)
        if plan.kind == "none":
            rows = self.table.describe() if route.native else []
            status, message, code = route.unserved(rows, ask.model, plan.reason)
            self.refuse(conn, req, route, Refused(status, message, code, [(b"x-request-id", ask.root_b)]))
            return
        sink = Anthropic(ask.model or "") if route.anthropic else OPENAI  # the client protocol's
        d = Delivery(ask, sink, WholeFold(bool(route.chat)) if ask.fold else None)
        rec = self.recorder
        if rec is not None:
            d.trace = rec.begin(
                ask.root, ask.client_id, route.name, ask.model, ask.stream, self.table.last_seq, ask.t0
            )
        deadlines = self.deadlines
        task = conn.task if deadlines is not None else None
        if deadlines is not None and task is not None:
            deadlines.start(task)
        try:
            await self.attempts.run(d, plan)
        except asyncio.CancelledError:
            if deadlines is None or task is None or not deadlines.expired(task):
                if self.metrics is not None:
                    self.metrics.aborts.labels(route=route.name).inc()
                if rec is not None:
                    rec.end(d.trace, 0, d.ttft, d.ending or "the client went away")
                raise  # the client went away
            # Our own request timeout: engine connections were closed on the way out (never
            # reused after a cut); answer if nothing was sent yet.
            task.uncancel()
            log.warning(
                "request %s timed out after the request timeout of %g s%s",
                ask.tag, deadlines.timeout, "" if d.committed else ", before any answer",
            )  # fmt: skip
            d.timed_out(f"no complete answer within the request timeout of {deadlines.timeout:g} s")
        finally:
            if deadlines is not None and task is not None:
                deadlines.due.pop(task, None)  # ended in time (or not: then swept already)
        if rec is not None:
            rec.end(
                d.trace, d.status, d.ttft, d.ending or ("answered" if d.status < 500 else "answered an error")
            )
        if self.metrics is not None:
            self.metrics.stats.observe(route.name, d.status, time.perf_counter() - ask.t0, d.ttft)
        if self.on_done is not None:
            self.on_done(d)

    def refuse(self, conn: ClientConn, req: Request, route: ClientRoute, r: Refused) -> None:
        """Answer a refusal in the route's dialect (counted; no latency: nothing was routed)."""
        body = (
            anthropic_error(r.status, r.message)
            if route.anthropic
            else openai_error(r.status, r.message, r.code)
        )
        conn.send(req, r.status, body, extra=r.headers)
        if self.metrics is not None:
            self.metrics.stats.count(route.name, r.status)


class Deadlines:
    """The request timeout: a table swept once a second instead of a timer per request (a timer
    handle costs more than the routing decision). A request's task is its connection's."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.loop = asyncio.get_running_loop()
        self.due: dict[asyncio.Task[Any], float] = {}  # popped by the pipeline when a request ends
        self._expired: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.TimerHandle | None = None

    def start(self, task: asyncio.Task[Any]) -> None:
        """Cancel `task` once the timeout has passed (unless `end` comes first)."""
        self.due[task] = self.loop.time() + self.timeout
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(_SWEEP, self._sweep)

    def expired(self, task: asyncio.Task[Any]) -> bool:
        """Whether `task` was cancelled by its timeout (said once)."""
        if task in self._expired:
            self._expired.discard(task)
            return True
        return False

    def _sweep(self) -> None:
        now = self.loop.time()
        for task, due in list(self.due.items()):
            if due <= now:
                del self.due[task]
                self._expired.add(task)
                task.cancel()
        self._sweeper = self.loop.call_later(_SWEEP, self._sweep) if self.due else None
