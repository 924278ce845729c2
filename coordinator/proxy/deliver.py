"""How an engine's answer reaches the client: one sink per client protocol, and the delivery
state of a request (what the client has been sent).

`Delivery` is the only state of a request that changes while it is served; its fields are
written here and by the attempt loop (the sink and fold a continuation goes on with, the trace). `deliver()` hands an opened engine response to the request's sink, or
folds a whole answer asked as a stream (`wholefold.py`) and answers it in one body.

Sinks, one per client protocol: `OpenAI` passes the engine's bytes through untouched (its
own framing, a head with the client's `x-request-id`; an engine that frames nothing is read
whole) and is the hot path for every OpenAI and engine-native route; `Spliced` carries an
OpenAI stream on after a continuation; `Anthropic` translates chat answers and streams to
Anthropic messages and events. Each shapes the coordinator's own errors and an engine's in
its dialect.
"""

from __future__ import annotations

import asyncio
import time
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from typing import Any

import orjson

from coordinator.anthropic import chat_to_message
from coordinator.anthropic_stream import StreamTranslator
from coordinator.endpoint import Endpoint
from coordinator.proxy.ask import Ask
from coordinator.proxy.continuation import Progress, ProgressFold, StreamSplicer
from coordinator.proxy.outcome import Broken, Retry
from coordinator.proxy.upstream import UpstreamConn, UpstreamError
from coordinator.proxy.wholefold import WholeFold
from core.http_errors import (
    anthropic_error,
    anthropic_from,
    anthropic_sse_error,
    openai_error,
    openai_sse_error,
)
from http1 import wire


class Delivery:
    """What one request's client has been sent, and by which endpoints."""

    __slots__ = (
        "ask", "committed", "ending", "fold", "prefill_by", "resp_body", "served_by", "sink", "status", "trace", "ttft",
    )  # fmt: skip

    def __init__(self, ask: Ask, sink: Sink, fold: WholeFold | None = None) -> None:
        self.ask = ask
        self.sink = sink
        self.fold = fold
        self.committed = False  # a head went out: from here on a failure is no clean retry
        self.status = 0
        self.ttft: float | None = None
        self.served_by: Endpoint | None = None  # the endpoint whose response the client got
        self.prefill_by: Endpoint | None = None  # its prefill peer in P/D
        # That response's decoded body (the detector's), or what a long event stream folded of it
        self.resp_body: list[bytes] | ProgressFold | None = None
        self.ending = ""  # how an answer under way ended without its engine's last byte
        self.trace: Any = None  # its routing record as it happens (`record.Trace`)

    def send(self, status: int, body: bytes) -> None:
        """Answer with a whole response (committed from here on)."""
        self.status = status
        self.committed = True
        ask = self.ask
        ask.conn.send(ask.req, status, body, extra=[(b"x-request-id", ask.root_b)])

    def send_error(self, status: int, message: str, code: str | None = None) -> None:
        """Answer an error of the coordinator's in the client's dialect."""
        self.send(status, self.sink.error(status, message, code))

    def relay_error(self, status: int, body: bytes) -> None:
        """Answer with an engine's error body, in the client's dialect."""
        self.send(status, self.sink.relay_error(status, body))

    def end_with_error(self, message: str) -> None:
        """End a stream already under way with an error event."""
        self.ending = f"ended with an error event: {message}"
        self.ask.conn.write(wire.chunk(self.sink.stream_error(message)) + wire.LAST_CHUNK)

    def end_stream(self, done: bool) -> None:
        """Close a stream whose engine died after its last token (`done`: it had sent [DONE])."""
        self.ask.conn.write(self.sink.end(done))

    def cut(self) -> None:
        """Close the client's connection mid-answer: nothing else is honest."""
        self.ending = "cut mid-answer"
        self.ask.conn.close()

    def timed_out(self, message: str) -> None:
        """The request timeout passed: a 504 if nothing went out yet, else a cut."""
        if self.committed:
            self.cut()
        else:
            self.send_error(504, message, "request_timeout")
        self.status, self.ending = 504, f"timed out: {message}"


def deliver(
    d: Delivery, up: UpstreamConn, ep: Endpoint, prefill: Endpoint | None
) -> Coroutine[Any, Any, None]:
    """Hand `ep`'s opened response (its head and first bytes in) to the client: the sink's
    (or the fold's) coroutine, handed back rather than awaited, a frame fewer on the hot path."""
    if d.ttft is None:
        d.ttft = time.perf_counter() - d.ask.t0
    if not d.committed:
        d.status = up.status
    if d.fold is None:
        return d.sink.relay(d, up, ep, prefill)
    return _fold(d, d.fold, up, ep, prefill)


async def read_whole(up: UpstreamConn, ep: Endpoint) -> bytes:
    """The engine's whole body, its connection released; failing midway is a Retry (the client
    saw nothing of it)."""
    try:
        data = await up.read_all()
    except UpstreamError as exc:
        raise Retry(f"{ep.key}: {exc}", ep=ep, cause=exc) from None
    except BaseException:
        up.close()
        raise
    up.release()
    return data


def answer_folded(d: Delivery, fold: WholeFold, ep: Endpoint, prefill: Endpoint | None) -> None:
    """Answer a folded whole answer (served last by `ep`) in the client's dialect."""
    d.served_by, d.prefill_by = ep, prefill
    if fold.error is not None:
        d.relay_error(*fold.error_answer())
        return
    body = orjson.dumps(fold.answer())
    d.resp_body = [body]
    d.send(200, d.sink.whole(200, body))


async def _fold(
    d: Delivery, fold: WholeFold, up: UpstreamConn, ep: Endpoint, prefill: Endpoint | None
) -> None:
    """The client saw nothing before the fold is answered, so an engine failing midway is
    `Broken` with the delivery uncommitted: the attempt loop continues it from the fold."""
    if up.status != 200 or not up.sse:  # a refusal, or an engine that answered whole
        await _whole(d, up, ep, prefill)
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
    if fold.finish is None and fold.error is None:
        # The stream ended with no finish reason: the engine dropped the answer midway without
        # saying so. It is not whole: continued elsewhere from what it holds, as a broken one.
        raise Broken(
            up, ep, UpstreamError("the engine's stream ended without a finish reason", got_bytes=True)
        )
    up.release()
    answer_folded(d, fold, ep, prefill)


async def _whole(d: Delivery, up: UpstreamConn, ep: Endpoint, prefill: Endpoint | None) -> None:
    data = await read_whole(up, ep)
    d.served_by, d.prefill_by, d.resp_body = ep, prefill, up.body
    d.send(up.status, d.sink.whole(up.status, data))


async def _until_end(
    d: Delivery, up: UpstreamConn, ep: Endpoint, prefill: Endpoint | None, fut: asyncio.Future[None] | None
) -> None:
    """Wait for the end of a response already committed to the client (`fut` None: it ended);
    `Broken` when the engine failed midway."""
    conn = d.ask.conn
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
    d.served_by, d.prefill_by, d.resp_body = ep, prefill, up.body if up.kept is None else up.folded()
    up.release()


def _relayed(d: Delivery, up: UpstreamConn) -> None:
    """The engine's bytes now go to this client: its slowness pauses the engine's reading."""
    conn = d.ask.conn
    conn.upstream = up
    if conn.write_paused:
        up.pause()


# ---------------------------------------------------------------------------- sinks


class Sink(ABC):
    """How one client protocol gets an engine's answer, and its errors."""

    raw = False  # True: the engine's own framing reaches the client

    @abstractmethod
    async def relay(self, d: Delivery, up: UpstreamConn, ep: Endpoint, prefill: Endpoint | None) -> None:
        """Deliver an opened response to the client (`Broken` if the engine fails midway)."""

    @abstractmethod
    def whole(self, status: int, data: bytes) -> bytes:
        """An engine's whole answer (an OpenAI body), as this client's body."""

    @abstractmethod
    def continued(self, p: Progress) -> Sink:
        """The sink that carries a broken stream on from what `p` says the client has."""

    @abstractmethod
    def end(self, done: bool) -> bytes:
        """Bytes closing a stream whose engine died past its last token."""

    def error(self, status: int, message: str, code: str | None) -> bytes:
        """The coordinator's own error body."""
        return openai_error(status, message, code)

    def relay_error(self, status: int, body: bytes) -> bytes:
        """An engine's error body for this client."""
        return body

    def stream_error(self, message: str) -> bytes:
        """The SSE event ending a stream under way with an upstream error."""
        return openai_sse_error(502, message)


class OpenAI(Sink):
    """The engine's bytes passed through untouched: OpenAI routes and engine-native ones."""

    raw = True

    async def relay(self, d: Delivery, up: UpstreamConn, ep: Endpoint, prefill: Endpoint | None) -> None:
        head = _head(d.ask, up)
        if head is None:  # neither chunked nor a length: read it whole, send it with one
            await _whole(d, up, ep, prefill)
            return
        conn = d.ask.conn
        conn.upstream = up  # as `_relayed`, inline: this is the hot path
        if conn.write_paused:
            up.pause()
        transport = conn.transport
        assert transport is not None  # set when the connection was made, never unset
        try:
            fut = up.commit(transport, head)
        except UpstreamError as exc:
            conn.upstream = None
            raise Retry(f"{ep.key}: {exc}", ep=ep, cause=exc) from None
        d.committed = True
        await _until_end(d, up, ep, prefill, fut)

    def whole(self, status: int, data: bytes) -> bytes:
        return data

    def continued(self, p: Progress) -> Sink:
        return Spliced(p)

    def end(self, done: bool) -> bytes:
        return wire.LAST_CHUNK if done else wire.chunk(b"data: [DONE]\n\n") + wire.LAST_CHUNK


OPENAI = OpenAI()  # stateless: one for every request that passes bytes through


class _Translating(Sink):
    """A sink that writes frames of its own: the engine's decoded body in, client chunks out."""

    @abstractmethod
    def feed(self, data: bytes) -> bytes:
        """Client bytes (unframed) for this piece of the engine's decoded body."""

    def head(self, ask: Ask) -> bytes | None:
        """The response head to write before the first bytes, or None when it went out."""
        return None

    async def _translate(self, d: Delivery, up: UpstreamConn, ep: Endpoint, prefill: Endpoint | None) -> None:
        conn = d.ask.conn
        head = self.head(d.ask)
        if head is not None:
            conn.write(head)
        d.committed = True
        _relayed(d, up)

        def on_data(data: bytes) -> None:
            out = self.feed(data)
            if out:
                conn.write(wire.chunk(out))

        await _until_end(d, up, ep, prefill, up.stream_to(on_data))
        conn.write(self.end(True))


class Spliced(_Translating):
    """A continued OpenAI stream: the continuation's events rewritten into the original stream."""

    def __init__(self, p: Progress) -> None:
        self.splicer = StreamSplicer(p)

    async def relay(self, d: Delivery, up: UpstreamConn, ep: Endpoint, prefill: Endpoint | None) -> None:
        await self._translate(d, up, ep, prefill)

    def feed(self, data: bytes) -> bytes:
        return self.splicer.feed(data)

    def whole(self, status: int, data: bytes) -> bytes:
        return data

    def continued(self, p: Progress) -> Sink:
        return Spliced(p)

    def end(self, done: bool) -> bytes:
        return (b"" if self.splicer.done else wire.chunk(b"data: [DONE]\n\n")) + wire.LAST_CHUNK


class Anthropic(_Translating):
    """An Anthropic client: chat answers become messages, chat streams Anthropic events
    (a continuation spliced in first), every error Anthropic-shaped."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.translator = StreamTranslator(model)
        self.splicer: StreamSplicer | None = None
        self.head_sent = False

    async def relay(self, d: Delivery, up: UpstreamConn, ep: Endpoint, prefill: Endpoint | None) -> None:
        if not d.committed and (not d.ask.stream or up.status != 200):
            await _whole(d, up, ep, prefill)
            return
        await self._translate(d, up, ep, prefill)

    def head(self, ask: Ask) -> bytes | None:
        if self.head_sent:
            return None
        self.head_sent = True
        headers = [
            (b"content-type", wire.SSE_CT),
            (b"cache-control", b"no-cache"),
            (b"x-request-id", ask.root_b),
        ]
        return wire.build_head(200, headers, content_length=None, keep_alive=ask.req.keep_alive)

    def feed(self, data: bytes) -> bytes:
        if self.splicer is not None:
            data = self.splicer.feed(data)
        return self.translator.feed_sse(data)

    def whole(self, status: int, data: bytes) -> bytes:
        if status != 200:
            return anthropic_from(status, data)  # the engine's error, in the client's dialect
        try:
            resp = orjson.loads(data)
        except orjson.JSONDecodeError:
            return anthropic_error(502, "engine returned a body that is not JSON")
        return orjson.dumps(chat_to_message(resp, self.model))

    def continued(self, p: Progress) -> Sink:
        self.splicer = StreamSplicer(p)  # the translator goes on: one message, one stream
        return self

    def end(self, done: bool) -> bytes:
        out = self.translator.finish()
        return (wire.chunk(out) if out else b"") + wire.LAST_CHUNK

    def error(self, status: int, message: str, code: str | None) -> bytes:
        return anthropic_error(status, message)

    def relay_error(self, status: int, body: bytes) -> bytes:
        return anthropic_from(status, body)

    def stream_error(self, message: str) -> bytes:
        return anthropic_sse_error(502, message)


def _head(ask: Ask, up: UpstreamConn) -> bytes | None:
    """The engine's head for the client (its x-request-id ours), None when the engine framed
    its body neither chunked nor with a length."""
    headers = wire.forwardable(up.headers)
    headers.append((b"x-request-id", ask.root_b))
    length: int | None = None
    if not up.chunked:
        for name, value in up.headers:
            if name == b"content-length":
                length = int(value)
                break
        else:
            return None
    return wire.build_head(up.status, headers, content_length=length, keep_alive=ask.req.keep_alive)
