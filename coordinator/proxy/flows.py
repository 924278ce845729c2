"""How a request reaches engines: single hop, vLLM handoff, SGLang bootstrap; retries before
the first byte, circuit breakers, and continuing a stream whose engine died midway.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson

from coordinator.adapters import sglang, vllm
from coordinator.breaker import Breakers
from coordinator.errors import error_body
from coordinator.policies import Policy, RequestInfo, prompt_prefix
from coordinator.proxy import http1
from coordinator.proxy.call import AnthropicSink, Call, Retry, SpliceSink
from coordinator.proxy.exchange import Upstreams
from coordinator.proxy.resume import StreamSplicer, continuation_body, progress_of
from coordinator.proxy.upstream import UpstreamConn, UpstreamError
from coordinator.table import Endpoint, Plan, RoutingTable
from core.events import Role

log = logging.getLogger(__name__)


class Flows:
    """Routes calls along a plan; every failure before the first byte is retried elsewhere."""

    def __init__(
        self,
        table: RoutingTable,
        ups: Upstreams,
        breakers: Breakers,
        policies: dict[Role, Policy],
        *,
        retries: int,
        metrics: Any = None,
    ) -> None:
        self.table = table
        self.ups = ups
        self.breakers = breakers
        self.policies = policies
        self.retries = retries
        self.metrics = metrics
        self._background: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ plans

    async def run(self, call: Call, plan: Plan) -> None:
        """Serve `call` along `plan` (kind single or pd)."""
        if plan.kind == "single":
            assert plan.role is not None
            await self.single(call, plan.role)
        elif plan.capability == vllm.CAPABILITY:
            await self.handoff(call, plan)
        elif plan.capability == sglang.CAPABILITY:
            await self.bootstrap(call, plan)
        else:
            self.fail(call, None, f"P/D protocol {plan.capability!r} has no adapter", status=503)

    def _info(self, call: Call, policy: Policy) -> RequestInfo:
        prefix = prompt_prefix(call.body) if policy.name == "prefix_affinity" else b""
        return RequestInfo(call.model, prefix, call.root)

    async def single(self, call: Call, role: Role) -> None:
        """One hop to a union (or prefill-only) endpoint."""
        policy = self.policies[role]
        info = self._info(call, policy)
        last: Retry | None = None
        for attempt in range(1, self.retries + 2):
            ep = policy.select(self.table.candidates(role, call.model), info, call.exclude)
            if ep is None:
                break
            try:
                await self.serve_on(call, ep, call.raw, call.request_id(attempt))
                return
            except Retry as r:
                call.exclude.add(ep.key)
                last = r
                self._retried(r)
        self.fail(call, last, f"{role.value} endpoint")

    async def handoff(self, call: Call, plan: Plan) -> None:
        """vLLM handoff: prefill for one token, then decode with the prefill's KV params."""
        pp, dp = self.policies[Role.PREFILL], self.policies[Role.DECODE]
        pinfo, dinfo = self._info(call, pp), self._info(call, dp)
        last: Retry | None = None
        for attempt in range(1, self.retries + 2):
            p = pp.select(self._cands(Role.PREFILL, call, plan), pinfo, call.exclude)
            d = dp.select(self._cands(Role.DECODE, call, plan), dinfo, call.exclude)
            if p is None or d is None:
                break
            rid = call.request_id(attempt)
            try:
                status, data = await self._prefill(
                    p, call.path, orjson.dumps(vllm.prefill_body(call.body, rid)), rid
                )
            except Retry as r:
                call.exclude.add(p.key)
                last = r
                self._retried(r)
                continue
            if status >= 400:  # the request itself is bad: the client gets the engine's answer
                self._send(call, status, data)
                return
            try:
                kv = vllm.kv_params_of(orjson.loads(data))
            except orjson.JSONDecodeError:
                kv = None
            dbody = orjson.dumps(vllm.decode_body(call.body, kv, rid))
            call.prefill_by = p
            try:
                await self.serve_on(call, d, dbody, rid)
                return
            except Retry as r:
                call.exclude.add(d.key)
                last = r
                self._retried(r)
        self.fail(call, last, "prefill/decode pair")

    async def bootstrap(self, call: Call, plan: Plan) -> None:
        """SGLang bootstrap: prefill and decode at once; the client gets the decode stream."""
        pp, dp = self.policies[Role.PREFILL], self.policies[Role.DECODE]
        pinfo, dinfo = self._info(call, pp), self._info(call, dp)
        last: Retry | None = None
        loop = asyncio.get_running_loop()
        for attempt in range(1, self.retries + 2):
            p = pp.select(self._cands(Role.PREFILL, call, plan), pinfo, call.exclude)
            d = dp.select(self._cands(Role.DECODE, call, plan), dinfo, call.exclude)
            if p is None or d is None:
                break
            rid = call.request_id(attempt)
            try:
                pbody, dbody = sglang.pd_bodies(
                    call.body,
                    prefill_host=p.host,
                    bootstrap_port=p.bootstrap_port,
                    pair_id=call.root,
                    attempt=attempt,
                    request_id=rid,
                )
            except sglang.BootstrapError as exc:
                call.exclude.add(p.key)
                last = Retry(str(exc), 503)
                continue
            call.prefill_by = p
            ptask = loop.create_task(self._prefill(p, call.path, orjson.dumps(pbody), rid))
            dtask = loop.create_task(self.serve_on(call, d, orjson.dumps(dbody), rid))
            try:
                done, _ = await asyncio.wait({ptask, dtask}, return_when=asyncio.FIRST_COMPLETED)
                if ptask in done and not call.committed and _prefill_failed(ptask):
                    # Decode would wait for KV that never comes: stop it and try another pair.
                    dtask.cancel()
                    self.ups.abort(d, rid)
                    await asyncio.gather(dtask, return_exceptions=True)
                    call.exclude.add(p.key)
                    last = _as_retry(ptask)
                    self._retried(last)
                    continue
                try:
                    await dtask
                except Retry as r:
                    if not ptask.done():
                        ptask.cancel()
                        self.ups.abort(p, rid)
                    self._keep(ptask)
                    call.exclude.add(d.key)
                    last = r
                    self._retried(r)
                    continue
                self._keep(ptask)
                return
            except asyncio.CancelledError:
                # The client went away: stop both engines.
                for t in (ptask, dtask):
                    t.cancel()
                    self._keep(t)
                self.ups.abort(p, rid)
                self.ups.abort(d, rid)
                raise
        self.fail(call, last, "prefill/decode pair")

    def _cands(self, role: Role, call: Call, plan: Plan) -> list[Endpoint]:
        return self.table.candidates(
            role, call.model, engine_type=plan.engine_type, capability=plan.capability
        )

    async def _prefill(self, p: Endpoint, path: bytes, body: bytes, rid: str) -> tuple[int, bytes]:
        """A prefill leg, whole; Retry on a transport error or a 5xx."""
        self.breakers.on_attempt(p.key)
        p.inflight += 1
        try:
            status, data = await self.ups.fetch(p, path, body, rid)
        except UpstreamError as exc:
            self._upstream_failed(p, exc)
            raise Retry(f"prefill {p.key}: {exc}", 504 if exc.timeout else 502) from None
        except asyncio.CancelledError:
            self.breakers.release_probe(p.key)
            raise
        finally:
            p.inflight -= 1
        if status >= 500:
            self._upstream_failed(p, None)
            raise Retry(f"prefill {p.key} answered HTTP {status}", status, data)
        self.breakers.success(p.key)
        return status, data

    # ------------------------------------------------------------------ one endpoint

    async def serve_on(self, call: Call, ep: Endpoint, body: bytes, rid: str) -> None:
        """Send `body` to `ep` and deliver its response to the client."""
        br = self.breakers
        br.on_attempt(ep.key)
        ep.inflight += 1
        try:
            try:
                up = await self.ups.open(ep, call.path, body, rid)
            except UpstreamError as exc:
                self._upstream_failed(ep, exc)
                raise Retry(f"{ep.key}: {exc}", 504 if exc.timeout else 502) from None
            except asyncio.CancelledError:
                br.release_probe(ep.key)
                raise
            if up.status >= 500:
                try:
                    data = await up.read_all()
                except UpstreamError as exc:
                    self._upstream_failed(ep, exc)
                    raise Retry(f"{ep.key}: {exc}") from None
                except BaseException:
                    up.close()
                    raise
                up.release()
                self._upstream_failed(ep, None)
                raise Retry(f"{ep.key} answered HTTP {up.status}", up.status, data)
            br.success(ep.key)
            await self._deliver(call, up, ep)
        finally:
            ep.inflight -= 1

    async def _deliver(self, call: Call, up: UpstreamConn, ep: Endpoint) -> None:
        conn = call.conn
        if call.ttft is None:
            call.ttft = time.perf_counter() - call.t0
        if not call.committed:
            call.status = up.status
        if call.sink is None and not call.anthropic:
            head = self._head(call, up)
            if head is None:
                await self._whole(call, up, ep, _as_is)
                return
            conn.upstream = up
            if conn.write_paused:
                up.pause()
            try:
                fut = up.commit(conn.transport, head)
            except UpstreamError as exc:
                conn.upstream = None
                self._upstream_failed(ep, exc)
                raise Retry(f"{ep.key}: {exc}") from None
            call.committed = True
            await self._until_end(call, up, ep, fut)
            return
        if call.anthropic and not call.stream:
            await self._whole(call, up, ep, _to_anthropic(call))
            return
        if up.status != 200 and not call.committed:
            await self._whole(call, up, ep, _as_is)
            return
        if call.sink is None:
            call.sink = AnthropicSink(call.model or "")
        sink = call.sink
        head = sink.head(call)
        if head is not None:
            conn.write(head)
        call.committed = True
        conn.upstream = up
        if conn.write_paused:
            up.pause()

        def on_data(data: bytes) -> None:
            out = sink.feed(data)
            if out:
                conn.write(out)

        if await self._until_end(call, up, ep, up.stream_to(on_data)):
            conn.write(sink.end())

    async def _until_end(
        self, call: Call, up: UpstreamConn, ep: Endpoint, fut: asyncio.Future[None] | None
    ) -> bool:
        """Wait for the end of a response already committed to the client (`fut` None: it
        ended). True when it ended on `ep`; False when the engine died and the stream was
        continued elsewhere or cut. The engine connection is released or closed either way."""
        conn = call.conn
        try:
            if fut is not None:
                await fut
        except UpstreamError as exc:
            conn.upstream = None
            await self._broken(call, up, ep, exc)
            return False
        except BaseException:
            conn.upstream = None
            up.close()
            raise
        conn.upstream = None
        call.served_by, call.resp_body = ep, up.body
        up.release()
        return True

    async def _whole(self, call: Call, up: UpstreamConn, ep: Endpoint, shape: Any) -> None:
        try:
            data = await up.read_all()
        except UpstreamError as exc:
            self._upstream_failed(ep, exc)
            raise Retry(f"{ep.key}: {exc}") from None
        except BaseException:
            up.close()
            raise
        up.release()
        call.served_by, call.resp_body = ep, up.body
        self._send(call, up.status, shape(up.status, data))

    def _head(self, call: Call, up: UpstreamConn) -> bytes | None:
        headers = http1.forwardable(up.headers)
        headers.append((b"x-request-id", call.root_b))
        length: int | None = None
        if not up.chunked:
            for name, value in up.headers:
                if name == b"content-length":
                    length = int(value)
                    break
            else:
                return None
        return http1.build_head(up.status, headers, content_length=length, keep_alive=call.req.keep_alive)

    # ------------------------------------------------------------------ a stream broke

    async def _broken(self, call: Call, up: UpstreamConn, ep: Endpoint, exc: UpstreamError) -> None:
        """The engine died after the head went out: continue the stream elsewhere if we can."""
        self._upstream_failed(ep, exc)
        up.close()
        call.exclude.add(ep.key)
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
            conn.close()  # the client sees a cut: nothing else is honest
            return
        cont = None if p.done else continuation_body(call.path, call.origin, p)
        if cont is None:
            conn.write(call.sink.end() if call.sink is not None else _raw_end(p.done))
            return
        if self.metrics is not None:
            self.metrics.continuations.inc()
        log.warning(
            "stream %s broke on %s after %d tokens; continuing elsewhere", call.root, ep.key, p.tokens
        )
        if isinstance(call.sink, AnthropicSink):
            call.sink.splicer = StreamSplicer(p)
        else:
            call.sink = SpliceSink(p)
        call.body = cont
        call.raw = orjson.dumps(cont)
        await self.run(call, self.table.plan(call.model))

    # ------------------------------------------------------------------ endings

    def fail(self, call: Call, last: Retry | None, what: str, status: int = 503) -> None:
        """Answer a call no attempt could serve."""
        if call.committed:
            msg = last.reason if last is not None else f"no routable {what} left"
            err = b'data: {"error":{"message":%b,"type":"upstream_error","code":null}}\n\n' % orjson.dumps(
                msg
            )
            if isinstance(call.sink, AnthropicSink):
                call.conn.write(http1.chunk(call.sink.translator.error(msg)) + http1.LAST_CHUNK)
            else:
                call.conn.write(http1.chunk(err) + http1.LAST_CHUNK)
            return
        if last is None:
            model = f" for model {call.model!r}" if call.model else ""
            self._send(call, status, error_body(status, f"no routable {what}{model}"))
        elif last.body is not None:
            self._send(call, last.status, last.body)
        else:
            self._send(
                call, last.status, error_body(last.status, f"every attempt failed; last: {last.reason}")
            )

    def _send(self, call: Call, status: int, body: bytes) -> None:
        call.status = status
        call.committed = True
        call.conn.send(call.req, status, body, extra=[(b"x-request-id", call.root_b)])

    def _retried(self, r: Retry) -> None:
        log.info("retrying elsewhere: %s", r.reason)
        if self.metrics is not None:
            self.metrics.retries.labels(reason="timeout" if r.status == 504 else "upstream").inc()

    def _upstream_failed(self, ep: Endpoint, exc: UpstreamError | None) -> None:
        self.breakers.failure(ep.key)
        if self.metrics is not None:
            kind = "http_5xx" if exc is None else ("timeout" if exc.timeout else "transport")
            self.metrics.upstream_errors.labels(endpoint=ep.key, kind=kind).inc()

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


def _as_retry(task: asyncio.Task[Any]) -> Retry:
    exc = None if task.cancelled() else task.exception()
    return exc if isinstance(exc, Retry) else Retry(f"prefill failed: {exc!r}")


def _as_is(status: int, data: bytes) -> bytes:
    return data


def _raw_end(done: bool) -> bytes:
    return http1.LAST_CHUNK if done else http1.chunk(b"data: [DONE]\n\n") + http1.LAST_CHUNK


def _to_anthropic(call: Call) -> Any:
    from coordinator.anthropic import chat_to_message

    def shape(status: int, data: bytes) -> bytes:
        if status != 200:
            return data
        try:
            resp = orjson.loads(data)
        except orjson.JSONDecodeError:
            return error_body(502, "engine returned a body that is not JSON")
        return orjson.dumps(chat_to_message(resp, call.model or ""))

    return shape
