"""The fault path of an answer whose engine failed after its head went out: end it, cut it, or
say what the next attempt sends to carry it on elsewhere. A whole answer asked of its engine
as a stream (`wholefold.py`) breaks the same way with nothing sent yet: it is answered from
its fold, or continued, or asked again from its start.

The attempt loop calls `on_broken` once the attempt that broke has let go of its endpoints,
and runs the `Next` it returns as its next attempt (the loop, not this module, puts the new
sink and fold on the delivery). The pure parts (what the client already got, the continuation
body, the splicing) are in `continuation.py`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson

from coordinator.endpoint import Endpoint
from coordinator.proxy.continuation import Progress, continuation_body, not_continuable
from coordinator.proxy.deliver import Sink, answer_folded
from coordinator.proxy.legs import Attempt
from coordinator.proxy.outcome import Broken
from coordinator.proxy.wholefold import WholeFold

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Next:
    """What the attempt after a break sends, and how its answer reaches the client."""

    body: dict[str, Any]
    raw: bytes
    sink: Sink
    fold: WholeFold | None
    progress: Progress | None  # what the client has of the stream so far (every segment)


def on_broken(at: Attempt, b: Broken, prev: Progress | None) -> Next | None:
    """The next attempt when the answer goes on elsewhere; None when it was ended, cut or
    answered here."""
    up, ep, exc = b.up, b.ep, b.exc
    legs = at.legs
    legs.upstream_failed(ep, exc)
    up.close()  # the engine sees the disconnect: that is vLLM's and the builtin's abort
    if exc.stalled or exc.left or exc.lost:
        at.abort(ep)  # SGLang's own abort, best effort, under this attempt's own request id
    faults = legs.faults
    if faults is not None:
        faults.broken(ep.key, exc.kind)
    d, ask = at.d, at.ask
    if d.fold is not None:
        return _whole_answer_broken(at, d.fold, ep, str(exc))
    p = up.progress()
    if prev is not None:
        p.text = prev.text + p.text
        p.tokens += prev.tokens
        p.stream_id, p.created = prev.stream_id, prev.created
    framed = not d.sink.raw or (up.chunked and not up.chunk_open)
    if ask.stream and p.clean and framed:
        if p.done or _spent(ask.body, p):
            # It had sent everything it was asked for: end it as the engine would have.
            if faults is not None:
                faults.continued(ep.key, None)
            d.end_stream(p.done)
            return None
        why = not_continuable(ask.body, p) if ask.route.continuable else None
        if why is not None:
            # Tools, logprobs, guided decoding, reasoning or tool calls already streamed: a
            # continuation would show a seam. The stream ends with an error event saying so.
            log.warning("stream %s broke on %s (%s): ended with an error, %s", ask.root, ep.key, exc, why)
            if faults is not None:
                faults.failed(ep.key)
            d.end_with_error(
                f"the engine serving this stream failed after {p.tokens} token(s) ({exc}); {why}"
            )
            return None
        cont = continuation_body(ask.route.path, ask.body, p) if ask.route.continuable else None
    else:
        cont = None
    if cont is None:
        # Cut midway, or an answer a continuation cannot carry on (an engine-native route, n > 1 …):
        # ending it as if it were complete would be a lie the client cannot see.
        log.warning("stream %s broke on %s (%s): cut, it cannot be continued", ask.root, ep.key, exc)
        if faults is not None:
            faults.failed(ep.key)
        d.cut()
        return None
    if legs.metrics is not None:
        legs.metrics.continuations.inc()
    log.warning(
        "stream %s broke on %s after %d tokens (%s); continuing elsewhere", ask.root, ep.key, p.tokens, exc
    )
    return Next(cont, orjson.dumps(cont), d.sink.continued(p), None, p)


def _spent(body: dict[str, Any], p: Progress) -> bool:
    """Whether the stream delivered every token its budget allowed."""
    for key in ("max_tokens", "max_completion_tokens"):
        limit = body.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit - p.tokens <= 0:
            return True
    return False


def _whole_answer_broken(at: Attempt, fold: WholeFold, ep: Endpoint, why: str) -> Next | None:
    """A folded whole answer's engine (`ep`) failed midway (the client saw nothing): the next
    attempt when it goes on elsewhere, None when it was answered here."""
    d, ask, legs = at.d, at.ask, at.legs
    p = fold.cut()
    cont = None if p.done or not p.text else continuation_body(ask.route.path, ask.body, p)
    if p.done or (p.text and cont is None):
        # It had finished, or spent its budget, before the cut: the fold is the whole answer.
        if fold.finish is None:
            fold.finish = "length"
        if legs.faults is not None:
            legs.faults.continued(ep.key, None)
        answer_folded(d, fold, ep, at.prefill)
        return None
    if cont is None or not fold.continuable:
        # Nothing to go on from, or what there is a continuation cannot carry: from the start.
        log.warning("whole answer %s broke on %s (%s): asked again elsewhere", ask.root, ep.key, why)
        return Next(ask.body, ask.raw, d.sink, fold if fold.continuable else WholeFold(fold.chat), None)
    if legs.metrics is not None:
        legs.metrics.whole_continuations.inc()
    log.warning(
        "whole answer %s broke on %s after %d tokens (%s); continuing elsewhere",
        ask.root,
        ep.key,
        p.tokens,
        why,
    )
    return Next(cont, orjson.dumps(cont), d.sink, fold, None)
