"""Admission: what a routed request must pass before any engine sees it, in order, the same for
every client route: key, method, size, rate limit (`gate`), then the body (`admit`): JSON,
reserved fields, the Anthropic translation, model, `stream`, the output budgets against the
model's limit. A refusal is a `Refused` the pipeline answers in the route's dialect; an
admitted request is an `Ask`.

Budget: the client's body is parsed once (orjson) for routing and, on a single hop, sent to
the engine as the very bytes the client sent; only a long whole answer is re-encoded, asked as
a stream so an engine failure midway can be continued (`wholefold.py`).
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson

from coordinator.anthropic import messages_to_chat
from coordinator.errors import CoordinatorError
from coordinator.metrics import CoordinatorMetrics
from coordinator.model_limits import ModelLimits
from coordinator.proxy.ask import RESERVED, Ask, Ids
from coordinator.proxy.routes import ClientRoute
from coordinator.proxy.wholefold import streamed_body
from coordinator.table import RoutingTable
from http1.auth import AUTHENTICATE, Access, Guard
from http1.request import Request
from http1.server import ClientConn


class RateRefusal(Protocol):
    """What a limiter says when it refuses (see `coordinator.ratelimit.Refusal`)."""

    @property
    def reason(self) -> str: ...

    @property
    def header(self) -> str: ...

    @property
    def message(self) -> str: ...


class Limiter(Protocol):
    """The rate-limit hook: `try_acquire` admits (None) or refuses; `release` ends an admitted one."""

    def try_acquire(self) -> RateRefusal | None: ...

    def release(self) -> None: ...


class Refused:
    """Why a request is answered before any engine sees it."""

    __slots__ = ("code", "headers", "message", "status")

    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self.status = status
        self.message = message
        self.code = code
        self.headers = headers


def denial(guard: Guard, req: Request) -> Refused | None:
    """401/403 unless the request carries a key for a user route (None: let it in)."""
    if not guard.enabled:
        return None
    denied = guard.check(Access.USER, req.headers.get)
    if denied is None:
        return None
    return Refused(
        denied.status, denied.message, denied.code, [AUTHENTICATE] if denied.status == 401 else None
    )


class Admission:
    """The checks of every routed request, and the ids of the admitted ones."""

    def __init__(
        self,
        table: RoutingTable,
        guard: Guard,
        *,
        limiter: Limiter | None = None,
        metrics: CoordinatorMetrics | None = None,
        continue_whole_from: int | None = None,
    ) -> None:
        self.table = table
        self.guard = guard
        self.limiter = limiter
        self.metrics = metrics
        self.continue_whole_from = continue_whole_from  # see `wholefold.py`
        self.max_tokens = ModelLimits(table)
        self.ids = Ids()

    def gate(self, req: Request, max_body: int) -> Refused | None:
        """Key, method, size and rate; None admits and holds a rate-limit slot until the
        limiter's `release`."""
        if self.guard.enabled:
            refused = denial(self.guard, req)
            if refused is not None:
                return refused
        if req.method != b"POST":
            return Refused(405, f"{req.path.decode('latin-1')} takes POST", "method_not_allowed")
        if req.too_large:
            return Refused(413, f"request body over the limit of {max_body} bytes", "body_too_large")
        limiter = self.limiter
        if limiter is not None:
            refusal = limiter.try_acquire()
            if refusal is not None:
                if self.metrics is not None:
                    self.metrics.rate_limited.labels(reason=refusal.reason).inc()
                retry = [(b"retry-after", refusal.header.encode())]
                return Refused(429, refusal.message, "rate_limit_exceeded", retry)
        return None

    def admit(self, conn: ClientConn, req: Request, route: ClientRoute) -> Ask | Refused:
        """The body's checks: the request as the engines get it, or why not."""
        try:
            body = orjson.loads(req.body)
        except orjson.JSONDecodeError as exc:
            return Refused(400, f"request body is not valid JSON: {exc}", "invalid_json")
        if not isinstance(body, dict):
            return Refused(400, "request body must be a JSON object", "invalid_json")
        raw = req.body
        if not RESERVED.isdisjoint(body):  # engine ids and P/D peers are the coordinator's to set
            body = {k: v for k, v in body.items() if k not in RESERVED}
            raw = orjson.dumps(body)
        if route.anthropic:
            try:
                body = messages_to_chat(body)
            except CoordinatorError as exc:
                return Refused(exc.status, exc.message, exc.code)
            raw = orjson.dumps(body)
        model = body.get("model")
        if model is not None:
            if not isinstance(model, str):
                return Refused(400, "model must be a string", "invalid_model")
            if not self.table.has_model(model):
                return Refused(404, f"model {model!r} is not served here", "model_not_found")
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            return Refused(400, "stream must be a boolean", "invalid_stream")
        if route.budgets:
            bad = self._budget(route.budgets, body, model)
            if bad is not None:
                return Refused(400, bad, "invalid_max_tokens")
        fold = False
        if stream is not True and route.chat is not None and self.continue_whole_from is not None:
            streamed = streamed_body(route.chat, body, self.continue_whole_from)
            if streamed is not None:
                body, raw, fold = streamed, orjson.dumps(streamed), True
                if self.metrics is not None:
                    self.metrics.whole_folded.inc()
        root = req.rid = self.ids.next()
        return Ask(conn, req, route, body, raw, root=root, fold=fold)

    def _budget(self, fields: tuple[str, ...], body: dict[str, Any], model: str | None) -> str | None:
        """Why the body's output budget is refused (a message naming the field), or None."""
        for field in fields:
            value = body.get(field)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                return f"{field}: must be an integer >= 1, got {value!r}"[:300]
            limit = self.max_tokens.get(model)
            if limit is not None and value > limit:
                what = f"model {model!r}" if model is not None else "any model served here"
                return f"{field}: {value} is over the limit of {limit} tokens of {what}"
        return None
