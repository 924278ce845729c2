"""One engine exchange delivered to the client: a prefill leg fetched whole, or a response
passed through (raw) or translated (a `Sink`), with the breaker told how the engine did.
These are the legs a P/D adapter combines (`coordinator.adapters`).

A failure before anything reached the client is a `Retry` naming the endpoint; a failure
after the head went out is `Broken` (the flows continue the stream elsewhere, once the
attempt that broke has let go of its endpoints).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson

from coordinator.breaker import Breakers
from coordinator.faultlog import FaultLog
from coordinator.metrics import CoordinatorMetrics
from coordinator.proxy.call import Call, Retry
from coordinator.proxy.client_sinks import AnthropicSink
from coordinator.proxy.pool import Upstreams
from coordinator.proxy.upstream import UpstreamConn, UpstreamError
from coordinator.table import Endpoint
from core.http_errors import anthropic_error, anthropic_from
from http1 import wire

# How a whole engine response becomes the client's body: (status, engine body) -> body.
Shape = Callable[[int, bytes], bytes]


class Broken(Exception):
    """The engine failed after the response was committed to the client."""

    def __init__(self, up: UpstreamConn, ep: Endpoint, exc: UpstreamError) -> None:
        super().__init__(str(exc))
        self.up = up
        self.ep = ep
        self.exc = exc


class Hop:
    """Talks to one engine for one attempt; the breaker and the metrics hear every outcome."""

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

    async def prefill(self, p: Endpoint, path: bytes, body: bytes, rid: str) -> tuple[int, bytes]:
        """A prefill leg, whole; Retry on a transport error or a 5xx."""
        self.breakers.on_attempt(p.key)
        p.inflight += 1
        try:
            status, data = await self.ups.fetch(p, path, body, rid)
        except UpstreamError as exc:
            self.upstream_failed(p, exc)
            raise Retry(f"prefill {p.key}: {exc}", 504 if exc.timeout else 502, ep=p) from None
        except asyncio.CancelledError:
            self.breakers.release_probe(p.key)
            raise
        finally:
            p.inflight -= 1
        if status >= 500:
            self.upstream_failed(p, None)
            raise Retry(f"prefill {p.key} answered HTTP {status}", status, data, ep=p)
        self.breakers.success(p.key)
        return status, data

    async def serve_on(self, call: Call, ep: Endpoint, body: bytes, rid: str) -> None:
        """Send `body` to `ep` and deliver its response to the client (callers count in-flight)."""
        br = self.breakers
        br.on_attempt(ep.key)
        try:
            up = await self.ups.open(ep, call.path, body, rid)
        except UpstreamError as exc:
            self.upstream_failed(ep, exc)
            raise Retry(f"{ep.key}: {exc}", 504 if exc.timeout else 502, ep=ep) from None
        except asyncio.CancelledError:
            br.release_probe(ep.key)
            raise
        if up.status >= 500:
            data = await self._body_of(up, ep)
            self.upstream_failed(ep, None)
            raise Retry(f"{ep.key} answered HTTP {up.status}", up.status, data, ep=ep)
        br.success(ep.key)
        if call.resuming is not None and self.faults is not None:
            self.faults.continued(call.resuming, ep.key)
        call.resuming = None
        await self._deliver(call, up, ep)

    async def _deliver(self, call: Call, up: UpstreamConn, ep: Endpoint) -> None:
        conn = call.conn
        if call.ttft is None:
            call.ttft = time.perf_counter() - call.t0
        if not call.committed:
            call.status = up.status
        if call.fold is not None:
            await self._fold(call, up, ep)
            return
        if call.sink is None and not call.anthropic:
            head = self._head(call, up)
            if head is None:
                await self._whole(call, up, ep, _as_is)
                return
            conn.upstream = up
            if conn.write_paused:
                up.pause()
            transport = conn.transport
            assert transport is not None  # set when the connection was made, never unset
            try:
                fut = up.commit(transport, head)
            except UpstreamError as exc:
                conn.upstream = None
                self.upstream_failed(ep, exc)
                raise Retry(f"{ep.key}: {exc}", ep=ep) from None
            call.committed = True
            await self._until_end(call, up, ep, fut)
            return
        if call.anthropic and not call.committed and (not call.stream or up.status != 200):
            await self._whole(call, up, ep, _to_anthropic(call))
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

        await self._until_end(call, up, ep, up.stream_to(on_data))
        conn.write(sink.end())

    async def _fold(self, call: Call, up: UpstreamConn, ep: Endpoint) -> None:
        """A whole answer asked as a stream (`wholefold.py`): folded, then answered in one body.
        The client saw nothing before that, so an engine failing midway is `Broken` with the
        call uncommitted: the flows continue the answer from the fold."""
        fold = call.fold
        assert fold is not None
        if up.status != 200 or not _is_sse(up.headers):  # a refusal, or an engine that answered whole
            await self._whole(call, up, ep, _to_anthropic(call) if call.anthropic else _as_is)
            return
        try:
            fut = up.stream_to(fold.feed)
            if fut is not None:
                await fut
        except UpstreamError as exc:
            raise Broken(up, ep, exc) from None
        except BaseException:
            up.close()
            raise
        up.release()
        answer_folded(call, ep)

    async def _until_end(
        self, call: Call, up: UpstreamConn, ep: Endpoint, fut: asyncio.Future[None] | None
    ) -> None:
        """Wait for the end of a response already committed to the client (`fut` None: it
        ended); `Broken` when the engine failed midway."""
        conn = call.conn
        try:
            if fut is not None:
                await fut
        except UpstreamError as exc:
            conn.upstream = None
            raise Broken(up, ep, exc) from None
        except BaseException:
            conn.upstream = None
            up.close()
            raise
        conn.upstream = None
        call.served_by, call.resp_body = ep, up.body
        up.release()

    async def _body_of(self, up: UpstreamConn, ep: Endpoint) -> bytes:
        """The engine's whole body, its connection released; failing midway is a Retry (the client saw nothing)."""
        try:
            data = await up.read_all()
        except UpstreamError as exc:
            self.upstream_failed(ep, exc)
            raise Retry(f"{ep.key}: {exc}", ep=ep) from None
        except BaseException:
            up.close()
            raise
        up.release()
        return data

    async def _whole(self, call: Call, up: UpstreamConn, ep: Endpoint, shape: Shape) -> None:
        data = await self._body_of(up, ep)
        call.served_by, call.resp_body = ep, up.body
        call.send(up.status, shape(up.status, data))

    def _head(self, call: Call, up: UpstreamConn) -> bytes | None:
        headers = wire.forwardable(up.headers)
        headers.append((b"x-request-id", call.root_b))
        length: int | None = None
        if not up.chunked:
            for name, value in up.headers:
                if name == b"content-length":
                    length = int(value)
                    break
            else:
                return None
        return wire.build_head(up.status, headers, content_length=length, keep_alive=call.req.keep_alive)

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
        """Charge `ep`'s circuit and count the failure by kind."""
        kind = "http_5xx" if exc is None else exc.kind
        self.breakers.failure(ep.key, f"{kind}: {exc}" if exc is not None else kind)
        if self.metrics is not None:
            self.metrics.upstream_errors.labels(endpoint=ep.key, kind=kind).inc()


def answer_folded(call: Call, ep: Endpoint) -> None:
    """Answer a folded whole answer (served last by `ep`) in the client's API."""
    fold = call.fold
    assert fold is not None
    call.served_by = ep
    if fold.error is not None:
        call.relay_error(*fold.error_answer())
        return
    resp = fold.answer()
    body = orjson.dumps(resp)
    call.resp_body = [body]
    if call.anthropic:
        body = _to_anthropic(call)(200, body)
    call.send(200, body)


def _is_sse(headers: list[tuple[bytes, bytes]]) -> bool:
    return any(name == b"content-type" and b"event-stream" in value for name, value in headers)


def _as_is(status: int, data: bytes) -> bytes:
    return data


def _to_anthropic(call: Call) -> Shape:
    from coordinator.anthropic import chat_to_message

    def shape(status: int, data: bytes) -> bytes:
        if status != 200:
            return anthropic_from(status, data)  # the engine's error, in the client's API
        try:
            resp = orjson.loads(data)
        except orjson.JSONDecodeError:
            return anthropic_error(502, "engine returned a body that is not JSON")
        return orjson.dumps(chat_to_message(resp, call.model or ""))

    return shape
