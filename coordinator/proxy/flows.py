"""How a request reaches engines: each attempt on the path the router chooses (a single hop, a
vLLM handoff or an SGLang bootstrap pair), retried elsewhere before the first byte, and a
stream whose engine died or stalled midway continued on any healthy path of its model.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from coordinator.adapters import sglang, vllm
from coordinator.breaker import Breakers
from coordinator.errors import error_body
from coordinator.faultlog import FaultLog
from coordinator.policies import Policy, RequestInfo
from coordinator.proxy.call import AnthropicSink, Call, Retry, SpliceSink
from coordinator.proxy.exchange import Upstreams
from coordinator.proxy.hop import Broken, Hop, send
from coordinator.proxy.resume import StreamSplicer, continuation_body, progress_of
from coordinator.routes import Router
from coordinator.table import Endpoint, Plan, Route, RoutingTable
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
        metrics: Any = None,
        faults: FaultLog | None = None,
    ) -> None:
        self.table = table
        self.ups = ups
        self.breakers = breakers
        self.policies = policies
        self.router = Router(table, policies)
        self.hop = Hop(ups, breakers, metrics=metrics, faults=faults)
        self.retries = retries
        self.metrics = metrics
        self.faults = faults
        self._background: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ paths

    async def run(self, call: Call, plan: Plan | None = None) -> None:
        """Serve `call` on the model's paths; a stream that breaks midway goes on elsewhere."""
        while True:
            try:
                await self._attempts(call, plan)
                return
            except Broken as b:
                if not self._resume(call, b):
                    return
                plan = None

    async def _attempts(self, call: Call, plan: Plan | None) -> None:
        info = RequestInfo(call.model, None, call.root, call.body)
        last: Retry | None = None
        for _ in range(self.retries + 1):
            route = self.router.choose(call.model, info, call.exclude, plan)
            if route is None:
                break
            call.attempts += 1
            rid = call.request_id(call.attempts)
            try:
                if route.prefill is None:
                    ep = route.ep
                    call.prefill_by = None  # an earlier P/D attempt's prefill is not this answer's
                    ep.inflight += 1
                    try:
                        await self.hop.serve_on(call, ep, call.raw, rid)
                    finally:
                        ep.inflight -= 1
                elif route.capability == vllm.CAPABILITY:
                    await self.handoff(call, route, rid)
                elif route.capability == sglang.CAPABILITY:
                    await self.bootstrap(call, route, rid)
                else:
                    self.fail(call, None, f"P/D protocol {route.capability!r} has no adapter")
                return
            except Retry as r:
                if r.ep is not None:
                    call.exclude.add(r.ep.key)
                last = r
                self._retried(r)
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
            if self._resume(call, b):
                await self.run(call)

    async def handoff(self, call: Call, route: Route, rid: str) -> None:
        """vLLM handoff: prefill for one token, then decode with the prefill's KV params."""
        p, d = route.prefill, route.ep
        assert p is not None
        d.inflight += 1  # a P/D request weighs on its decode from the moment it is routed
        try:
            status, data = await self.hop.prefill(
                p, call.path, orjson.dumps(vllm.prefill_body(call.body, rid)), rid
            )
            if status >= 400:  # the request itself is bad: the client gets the engine's answer
                send(call, status, data)
                return
            try:
                kv = vllm.kv_params_of(orjson.loads(data))
            except orjson.JSONDecodeError:
                kv = None
            call.prefill_by = p
            await self.hop.serve_on(call, d, orjson.dumps(vllm.decode_body(call.body, kv, rid)), rid)
        finally:
            d.inflight -= 1

    async def bootstrap(self, call: Call, route: Route, rid: str) -> None:
        """SGLang bootstrap: prefill and decode at once; the client gets the decode stream."""
        p, d = route.prefill, route.ep
        assert p is not None
        try:
            pbody, dbody = sglang.pd_bodies(
                call.body,
                prefill_host=p.host,
                bootstrap_port=p.bootstrap_port,
                pair_id=call.root,
                attempt=call.attempts,
                request_id=rid,
            )
        except sglang.BootstrapError as exc:
            raise Retry(str(exc), 503, ep=p) from None
        call.prefill_by = p
        loop = asyncio.get_running_loop()
        d.inflight += 1
        ptask = loop.create_task(self.hop.prefill(p, call.path, orjson.dumps(pbody), rid))
        dtask = loop.create_task(self.hop.serve_on(call, d, orjson.dumps(dbody), rid))
        try:
            done, _ = await asyncio.wait({ptask, dtask}, return_when=asyncio.FIRST_COMPLETED)
            if ptask in done and not call.committed and _prefill_failed(ptask):
                # Decode would wait for KV that never comes: stop it and try another path.
                dtask.cancel()
                self.ups.abort(d, rid)
                await asyncio.gather(dtask, return_exceptions=True)
                raise _as_retry(ptask, p)
            try:
                await dtask
            except (Retry, Broken):
                if not ptask.done():
                    ptask.cancel()
                    self.ups.abort(p, rid)
                raise
            finally:
                self._keep(ptask)
        except asyncio.CancelledError:
            # The client went away: stop both engines.
            for t in (ptask, dtask):
                t.cancel()
                self._keep(t)
            self.ups.abort(p, rid)
            self.ups.abort(d, rid)
            raise
        finally:
            d.inflight -= 1

    # ------------------------------------------------------------------ a stream broke

    def _resume(self, call: Call, b: Broken) -> bool:
        """The engine failed after the head went out: True when the stream goes on elsewhere
        (the call now carries the continuation), False when it was ended or cut here."""
        up, ep, exc = b.up, b.ep, b.exc
        self.hop.upstream_failed(ep, exc)
        up.close()  # the engine sees the disconnect: that is vLLM's and the builtin's abort
        if exc.stalled:
            self.ups.abort(ep, call.request_id(call.attempts))  # SGLang's own abort, best effort
        call.exclude.add(ep.key)
        faults = self.faults
        if faults is not None:
            faults.broken(ep.key, exc.kind)
        p = progress_of(b"".join(up.body))
        prev = call.progress
        if prev is not None:
            p.text = prev.text + p.text
            p.tokens += prev.tokens
            p.stream_id, p.created = prev.stream_id, prev.created
        call.progress = p
        conn = call.conn
        framed = call.sink is not None or (up.chunked and not up.chunk_open)
        if not call.stream or not p.clean or not framed:
            log.warning("stream %s broke on %s (%s): cut, it cannot be continued", call.root, ep.key, exc)
            if faults is not None:
                faults.failed(ep.key)
            conn.close()  # the client sees a cut: nothing else is honest
            return False
        cont = None if p.done else continuation_body(call.path, call.origin, p)
        if cont is None:
            if faults is not None:
                faults.continued(ep.key, None)
            conn.write(call.sink.end() if call.sink is not None else _raw_end(p.done))
            return False
        if self.metrics is not None:
            self.metrics.continuations.inc()
        log.warning(
            "stream %s broke on %s after %d tokens (%s); continuing elsewhere",
            call.root,
            ep.key,
            p.tokens,
            exc,
        )
        if isinstance(call.sink, AnthropicSink):
            call.sink.splicer = StreamSplicer(p)
        else:
            call.sink = SpliceSink(p)
        call.body = cont
        call.raw = orjson.dumps(cont)
        call.resuming = ep.key
        return True

    # ------------------------------------------------------------------ endings

    def fail(self, call: Call, last: Retry | None, what: str | None = None, status: int = 503) -> None:
        """Answer a call no attempt could serve."""
        if call.committed:
            if call.resuming is not None and self.faults is not None:
                self.faults.failed(call.resuming)
                call.resuming = None
            msg = last.reason if last is not None else (what or self._no_path(call))
            log.warning("stream %s ends with an error: %s", call.root, msg)
            err = b'data: {"error":{"message":%b,"type":"upstream_error","code":null}}\n\n' % orjson.dumps(
                msg
            )
            if isinstance(call.sink, AnthropicSink):
                call.conn.write(wire.chunk(call.sink.translator.error(msg)) + wire.LAST_CHUNK)
            else:
                call.conn.write(wire.chunk(err) + wire.LAST_CHUNK)
            return
        if last is None:
            send(call, status, error_body(status, what or self._no_path(call)))
        elif last.body is not None:
            send(call, last.status, last.body)
        else:
            send(call, last.status, error_body(last.status, f"every attempt failed; last: {last.reason}"))

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

    def _retried(self, r: Retry) -> None:
        log.info("retrying elsewhere: %s", r.reason)
        if self.metrics is not None:
            self.metrics.retries.labels(reason="timeout" if r.status == 504 else "upstream").inc()
        if self.faults is not None and r.ep is not None:
            self.faults.retried(r.ep.key, r.kind)

    def _keep(self, task: asyncio.Task[Any]) -> None:
        if task.done():
            if not task.cancelled():
                task.exception()
            return
        self._background.add(task)
        task.add_done_callback(_drop_from(self._background))


def _drop_from(bag: set[asyncio.Task[Any]]) -> Any:
    def done(task: asyncio.Task[Any]) -> None:
        bag.discard(task)
        if not task.cancelled():
            task.exception()  # a late prefill failure is only logged by its own code

    return done


def _prefill_failed(task: asyncio.Task[Any]) -> bool:
    return task.cancelled() or task.exception() is not None


def _as_retry(task: asyncio.Task[Any], p: Any) -> Retry:
    exc = None if task.cancelled() else task.exception()
    return exc if isinstance(exc, Retry) else Retry(f"prefill failed: {exc!r}", ep=p)


def _raw_end(done: bool) -> bytes:
    return wire.LAST_CHUNK if done else wire.chunk(b"data: [DONE]\n\n") + wire.LAST_CHUNK
