"""How a request reaches engines: each attempt on the path the router chooses (a single hop,
or a prefill → decode pair run by its protocol's adapter), retried elsewhere before the first
byte, and a stream whose engine died or stalled midway continued on any healthy path of its
model (`resume.py`). Every ending the client sees without an engine's answer is made here.
"""

from __future__ import annotations

import logging

from coordinator.adapters import adapter_for
from coordinator.breaker import Breakers
from coordinator.choose import Chooser
from coordinator.faultlog import FaultLog
from coordinator.metrics import CoordinatorMetrics
from coordinator.policies import Policy, RequestInfo
from coordinator.proxy.call import Call, Retry
from coordinator.proxy.hop import Broken, Hop
from coordinator.proxy.pool import Upstreams
from coordinator.proxy.resume import on_stream_broken
from coordinator.table import Endpoint, Plan, RoutingTable
from core.events import Role
from http1 import wire

log = logging.getLogger(__name__)


class Flows:
    """Routes calls along paths; every failure before the first byte is retried elsewhere."""

    def __init__(
        self,
        table: RoutingTable,
        ups: Upstreams,
        breakers: Breakers,
        policies: dict[Role, Policy],
        *,
        retries: int,
        metrics: CoordinatorMetrics | None = None,
        faults: FaultLog | None = None,
    ) -> None:
        self.table = table
        self.policies = policies
        self.router = Chooser(table, policies)
        self.hop = Hop(ups, breakers, metrics=metrics, faults=faults)
        self.retries = retries
        self.metrics = metrics
        self.faults = faults

    async def run(self, call: Call, plan: Plan | None = None) -> None:
        """Serve `call` on the model's paths; a stream that breaks midway goes on elsewhere."""
        while True:
            try:
                await self._attempts(call, plan)
                return
            except Broken as b:
                if not on_stream_broken(call, b, self.hop):
                    return
                plan = None

    async def _attempts(self, call: Call, plan: Plan | None) -> None:
        info = RequestInfo(call.model, None, call.root, call.body)
        last: Retry | None = None
        for _ in range(self.retries + 1):
            self.readmit(call)
            route = self.router.choose(plan or self.table.plan(call.model), info, call.exclude)
            if route is None:
                break
            call.attempts += 1
            rid = call.request_id(call.attempts)
            try:
                # One await deep on purpose: this is the hot path.
                if route.prefill is None:
                    ep = route.ep
                    call.prefill_by = None  # an earlier P/D attempt's prefill is not this answer's
                    ep.inflight += 1
                    try:
                        await self.hop.serve_on(call, ep, call.raw, rid)
                    finally:
                        ep.inflight -= 1
                else:
                    adapter = adapter_for(route.capability)
                    if adapter is None:
                        self.fail(call, None, f"P/D protocol {route.capability!r} has no adapter")
                        return
                    await adapter.run(call, route.prefill, route.ep, rid, self.hop)
                return
            except Retry as r:
                if r.ep is not None:
                    call.exclude.add(r.ep.key)
                last = r
                self.retried(r)
                # The next attempt weighs the paths there are now: the plan was made when the
                # request came, and a path that came back since (a restarted union) was not in it.
                plan = None
        self.fail(call, last)

    async def serve_on(self, call: Call, ep: Endpoint, body: bytes, rid: str) -> None:
        """One hop to an endpoint chosen outside the router (seed 003 routes): counted in-flight,
        and a stream that breaks midway goes on as in `run`."""
        try:
            ep.inflight += 1
            try:
                await self.hop.serve_on(call, ep, body, rid)
            finally:
                ep.inflight -= 1
        except Broken as b:
            if on_stream_broken(call, b, self.hop):
                await self.run(call)

    # ------------------------------------------------------------------ endings

    def fail(self, call: Call, last: Retry | None, what: str | None = None, status: int = 503) -> None:
        """Answer a call no attempt could serve (in the client's API)."""
        if call.resuming is not None and self.faults is not None:
            self.faults.failed(call.resuming)  # a stream, or a folded whole answer, not continued
            call.resuming = None
        if call.committed:
            msg = last.reason if last is not None else (what or self._no_path(call))
            log.warning("stream %s ends with an error: %s", call.root, msg)
            call.conn.write(wire.chunk(call.error_event(msg)) + wire.LAST_CHUNK)
            return
        if last is None:
            call.send_error(status, what or self._no_path(call))
            return
        # A request that reached engines and still failed: say why no path was left.
        log.warning(
            "request %s failed after %d attempt(s), last: %s; %s",
            call.tag,
            call.attempts,
            last.reason,
            self._no_path(call),
        )
        if last.body is not None:
            call.relay_error(last.status, last.body)
        else:
            call.send_error(last.status, f"every attempt failed; last: {last.reason}")

    def _no_path(self, call: Call) -> str:
        """Why no path is left for this call: each known endpoint of the model and its state."""
        model = f" for model {call.model!r}" if call.model else ""
        why = []
        for row in self.table.describe():
            if call.model is not None and row["model"] != call.model:
                continue
            key = row["key"]
            if key in call.exclude:
                why.append(f"{key} failed for this request")
            elif not row["routable"]:
                why.append(f"{key} {row['reason']}")
        return f"no healthy path left{model}" + (f" ({'; '.join(why)})" if why else "")

    def readmit(self, call: Call) -> None:
        """An endpoint that failed this request earlier is READY again as a new process: the
        request may go there (a request that outlived an engine's restart, its other paths
        failing meanwhile, got 502 while the restarted engine idled)."""
        for key in call.readmit(self.table.incarnation):
            log.info(
                "request %s: %s is a new process since it failed this request: a candidate again",
                call.tag,
                key,
            )
            if self.metrics is not None:
                self.metrics.readmitted.inc()

    def retried(self, r: Retry) -> None:
        """Count and log an attempt that failed before the first byte (another one follows)."""
        log.info("retrying elsewhere: %s", r.reason)
        if self.metrics is not None:
            self.metrics.retries.labels(reason="timeout" if r.status == 504 else "upstream").inc()
        if self.faults is not None and r.ep is not None:
            self.faults.retried(r.ep.key, r.kind)
