"""The fault path of a stream whose engine failed after its head went out: end it, cut it,
or make the call carry the request that continues it on another path. A whole answer asked
of its engine as a stream (`wholefold.py`) breaks the same way, with nothing sent yet: it is
answered from its fold, or continued, or asked again from its start.

The flows call `on_stream_broken` once the attempt that broke has let go of its endpoints,
and run the call again when it says so; the pure parts (what the client already got, the
continuation body, the splicing) are in `continuation.py`.
"""

from __future__ import annotations

import logging

import orjson

from coordinator.proxy.call import Call
from coordinator.proxy.client_sinks import AnthropicSink, SpliceSink
from coordinator.proxy.continuation import StreamSplicer, continuation_body, progress_of
from coordinator.proxy.hop import Broken, Hop, answer_folded
from coordinator.proxy.wholefold import WholeFold
from coordinator.table import Endpoint
from http1 import wire

log = logging.getLogger(__name__)


def on_stream_broken(call: Call, b: Broken, hop: Hop) -> bool:
    """True when the stream goes on elsewhere (the call now carries the continuation), False
    when it was ended or cut here."""
    up, ep, exc = b.up, b.ep, b.exc
    hop.upstream_failed(ep, exc)
    up.close()  # the engine sees the disconnect: that is vLLM's and the builtin's abort
    if exc.stalled:
        hop.abort(ep, call.request_id(call.attempts))  # SGLang's own abort, best effort
    call.exclude.add(ep.key)
    faults = hop.faults
    if faults is not None:
        faults.broken(ep.key, exc.kind)
    if call.fold is not None:
        return on_whole_answer_broken(call, ep, str(exc), hop)
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
    if hop.metrics is not None:
        hop.metrics.continuations.inc()
    log.warning(
        "stream %s broke on %s after %d tokens (%s); continuing elsewhere", call.root, ep.key, p.tokens, exc
    )
    if isinstance(call.sink, AnthropicSink):
        call.sink.splicer = StreamSplicer(p)
    else:
        call.sink = SpliceSink(p)
    call.body = cont
    call.raw = orjson.dumps(cont)
    call.resuming = ep.key
    return True


def on_whole_answer_broken(call: Call, ep: Endpoint, why: str, hop: Hop) -> bool:
    """A folded whole answer's engine failed midway (the client saw nothing): True when the
    call now carries the request that goes on elsewhere, False when it was answered here."""
    fold = call.fold
    assert fold is not None
    p = fold.cut()
    cont = None if p.done or not p.text else continuation_body(call.path, call.origin, p)
    if p.done or (p.text and cont is None):
        # It had finished, or spent its budget, before the cut: the fold is the whole answer.
        if fold.finish is None:
            fold.finish = "length"
        if hop.faults is not None:
            hop.faults.continued(ep.key, None)
        answer_folded(call, ep)
        return False
    call.resuming = ep.key
    if cont is None or not fold.continuable:
        # Nothing to go on from, or what there is a continuation cannot carry: from the start.
        if not fold.continuable:
            call.fold = WholeFold(fold.chat)
        call.body = call.origin
        call.raw = orjson.dumps(call.origin)
        log.warning("whole answer %s broke on %s (%s): asked again elsewhere", call.root, ep.key, why)
        return True
    if hop.metrics is not None:
        hop.metrics.whole_continuations.inc()
    log.warning(
        "whole answer %s broke on %s after %d tokens (%s); continuing elsewhere",
        call.root,
        ep.key,
        p.tokens,
        why,
    )
    call.body = cont
    call.raw = orjson.dumps(cont)
    return True


def _raw_end(done: bool) -> bytes:
    return wire.LAST_CHUNK if done else wire.chunk(b"data: [DONE]\n\n") + wire.LAST_CHUNK
