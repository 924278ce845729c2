"""The /v1 hot path: checks a request (size, key, rate, JSON, model, max_tokens), picks a
plan, hands it to the flows; every other path goes to the management app in-process (which
checks admin keys itself), or, when management has its own port, only the probes do.

Routing and key checks both use the request's normalised path (`Request.path`). Errors on
`/v1/messages` are Anthropic-shaped, every other one OpenAI-shaped.

Request ids: the coordinator always makes its own (the engines' request ids and SGLang
bootstrap rooms derive from it); a client's `x-request-id` is echoed back and logged, never
sent on, so two clients cannot collide on purpose.

Budget: the client's body is parsed once (orjson) for routing and, on a single hop, sent to
the engine as the very bytes the client sent; only a long whole answer is re-encoded, asked as
a stream so an engine failure midway can be continued (`wholefold.py`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from coordinator.errors import CoordinatorError, error_for_path
from coordinator.metrics import CoordinatorMetrics
from coordinator.model_limits import ModelLimits
from coordinator.proxy.asgi import ASGIApp, serve_asgi
from coordinator.proxy.call import RESERVED, Call, client_request_id
from coordinator.proxy.flows import Flows
from coordinator.proxy.native import NativeRoutes, handles
from coordinator.proxy.wholefold import WholeFold, streamed_body
from http1.auth import AUTHENTICATE, PROBES, Access, Guard
from http1.request import Request
from http1.server import ClientConn

CHAT = b"/v1/chat/completions"
COMPLETIONS = b"/v1/completions"
EMBEDDINGS = b"/v1/embeddings"
MESSAGES = b"/v1/messages"
COUNT_TOKENS = b"/v1/messages/count_tokens"
MODELS = b"/v1/models"
_PROBES = frozenset(p.encode() for p in PROBES)
# Output budgets a body may carry, per route.
_BUDGETS = {
    "chat": ("max_tokens", "max_completion_tokens"),
    "completions": ("max_tokens",),
    "messages": ("max_tokens",),
}

log = logging.getLogger(__name__)

_SWEEP = 1.0  # seconds between request-timeout sweeps

# Client path -> (metrics route name, engine path).
_GENERATION = {
    CHAT: ("chat", CHAT),
    COMPLETIONS: ("completions", COMPLETIONS),
    EMBEDDINGS: ("embeddings", EMBEDDINGS),
    MESSAGES: ("messages", CHAT),
}


class Refusal(Protocol):
    """What a limiter says when it refuses (see `coordinator.ratelimit.Refusal`)."""

    @property
    def reason(self) -> str: ...

    @property
    def header(self) -> str: ...

    @property
    def message(self) -> str: ...


class Limiter(Protocol):
    """The rate-limit hook: `try_acquire` admits (None) or refuses; `release` ends an admitted one."""

    def try_acquire(self) -> Refusal | None: ...

    def release(self) -> None: ...


class ProxyApp:
    """The request handler the protocol server calls for every request."""

    def __init__(
        self,
        flows: Flows,
        *,
        api_keys: list[str] | tuple[str, ...] = (),
        admin_keys: list[str] | tuple[str, ...] = (),
        metrics: CoordinatorMetrics | None = None,
        mgmt_app: ASGIApp | None = None,
        mgmt_probes_only: bool = False,
        limiter: Limiter | None = None,
        on_done: Callable[[Call], None] | None = None,
        request_timeout: float | None = None,
        continue_whole_from: int | None = None,
    ) -> None:
        self.flows = flows
        self.table = flows.table
        self.guard = Guard(api_keys, admin_keys, admin_field="coordinator.admin_keys")
        self.max_tokens = ModelLimits(self.table)
        self.metrics = metrics
        self.mgmt = mgmt_app
        # With management on its own port, this port hands the management app only the probes.
        self.mgmt_probes_only = mgmt_probes_only
        self.limiter = limiter
        self.on_done = on_done  # called with each finished Call (precision detector hook)
        self.request_timeout = request_timeout
        self.continue_whole_from = continue_whole_from  # see `wholefold.py`
        self._deadlines: dict[asyncio.Task[Any], float] = {}
        self._expired: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.TimerHandle | None = None
        # Root request ids: a random per-process prefix and a counter (unique across replicas
        # without a syscall per request).
        self._id_prefix = os.urandom(6).hex()
        self._id_counter = itertools.count(1)
        self.loop = asyncio.get_running_loop()
        self.native = NativeRoutes(self)  # seed 003: /generate, /v1/score, /v1/rerank, /tokenize ...

    async def __call__(self, conn: ClientConn, req: Request) -> None:
        path = req.path
        gen = _GENERATION.get(path)
        if gen is not None:
            if req.method != b"POST":
                self._error(conn, req, 405, f"{path.decode()} takes POST", "method_not_allowed")
                return
            await self._generate(conn, req, gen[0], gen[1])
            return
        if handles(path):
            await self.native(conn, req)
            return
        if path in (MODELS, COUNT_TOKENS):
            if self._denied(conn, req):
                return
            if path == MODELS:
                self._models(conn, req)
            else:
                self._count_tokens(conn, req)
            return
        if self.mgmt is not None and (not self.mgmt_probes_only or path in _PROBES):
            await serve_asgi(self.mgmt, conn, req)
            return
        self._error(conn, req, 404, f"no route for {path.decode('latin-1')}", "not_found")

    # ------------------------------------------------------------------ generation

    async def _generate(self, conn: ClientConn, req: Request, route: str, engine_path: bytes) -> None:
        if self._denied(conn, req):
            return
        if req.too_large:
            self._error(
                conn, req, 413, f"request body over the limit of {conn.max_body} bytes", "body_too_large"
            )
            return
        limiter = self.limiter
        if limiter is not None:
            refusal = limiter.try_acquire()
            if refusal is not None:
                if self.metrics is not None:
                    self.metrics.rate_limited.labels(reason=refusal.reason).inc()
                retry = [(b"retry-after", refusal.header.encode())]
                self._error(conn, req, 429, refusal.message, "rate_limit_exceeded", retry)
                return
        try:
            await self._routed(conn, req, route, engine_path)
        finally:
            if limiter is not None:
                limiter.release()

    async def _routed(self, conn: ClientConn, req: Request, route: str, engine_path: bytes) -> None:
        try:
            body = orjson.loads(req.body)
        except orjson.JSONDecodeError as exc:
            self._error(conn, req, 400, f"request body is not valid JSON: {exc}", "invalid_json")
            return
        if not isinstance(body, dict):
            self._error(conn, req, 400, "request body must be a JSON object", "invalid_json")
            return
        raw = req.body
        if not RESERVED.isdisjoint(body):
            body = {k: v for k, v in body.items() if k not in RESERVED}
            raw = orjson.dumps(body)
        anthropic = route == "messages"
        if anthropic:
            from coordinator.anthropic import messages_to_chat

            try:
                body = messages_to_chat(body)
            except CoordinatorError as exc:
                self._error(conn, req, exc.status, exc.message, exc.code)
                return
            raw = orjson.dumps(body)
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            self._error(conn, req, 400, "model must be a string", "invalid_model")
            return
        if model is not None and not self.table.has_model(model):
            self._error(conn, req, 404, f"model {model!r} is not served here", "model_not_found")
            return
        stream = body.get("stream")
        if stream is not None and not isinstance(stream, bool):
            self._error(conn, req, 400, "stream must be a boolean", "invalid_stream")
            return
        bad = self._budget(route, body, model)
        if bad is not None:
            self._error(conn, req, 400, bad, "invalid_max_tokens")
            return
        plan = self.table.plan(model)
        if plan.kind == "none":
            self._error(conn, req, 503, plan.reason or "no routable instance", "no_routable_instance")
            return
        root = req.rid = self._next_id()
        call = Call(conn, req, route, engine_path, body, raw, root, client_request_id(req.headers))
        call.anthropic = anthropic
        if stream is not True and self.continue_whole_from is not None and route != "embeddings":
            streamed = streamed_body(route != "completions", body, self.continue_whole_from)
            if streamed is not None:
                call.fold = WholeFold(route != "completions")
                call.body = call.origin = streamed
                call.raw = orjson.dumps(streamed)
                if self.metrics is not None:
                    self.metrics.whole_folded.inc()
        task = self._deadline(call) if self.request_timeout is not None else None
        try:
            await self.flows.run(call, plan)
        except asyncio.CancelledError:
            if task is None or task not in self._expired:
                if self.metrics is not None:
                    self.metrics.aborts.labels(route=route).inc()
                raise
            # Our own request timeout, not the client: engine connections were closed on the
            # way out (never reused after a cut); answer if nothing was sent yet.
            self._expired.discard(task)
            task.uncancel()
            log.warning(
                "request %s timed out after the request timeout of %g s%s",
                call.tag, self.request_timeout, "" if call.committed else ", before any answer",
            )  # fmt: skip
            if call.committed:
                conn.close()
            else:
                msg = f"no complete answer within the request timeout of {self.request_timeout:g} s"
                self._error(conn, req, 504, msg, "request_timeout", [(b"x-request-id", call.root_b)])
            call.status = 504
        finally:
            if task is not None:
                self._deadlines.pop(task, None)
        self._observe(call)
        if self.on_done is not None:
            self.on_done(call)

    def _deadline(self, call: Call) -> asyncio.Task[Any] | None:
        # A table swept once a second instead of a timer per request (a timer handle costs
        # more than the routing decision). The connection's task is the one serving `call`.
        task = call.conn.task
        if task is None or self.request_timeout is None:
            return None
        self._deadlines[task] = self.loop.time() + self.request_timeout
        if self._sweeper is None:
            self._sweeper = self.loop.call_later(_SWEEP, self._sweep)
        return task

    def _sweep(self) -> None:
        loop = self.loop
        now = loop.time()
        for task, deadline in list(self._deadlines.items()):
            if deadline <= now:
                del self._deadlines[task]
                self._expired.add(task)
                task.cancel()
        self._sweeper = loop.call_later(_SWEEP, self._sweep) if self._deadlines else None

    def _next_id(self) -> str:
        return self._id_prefix + format(next(self._id_counter), "010x")

    def _budget(self, route: str, body: dict[str, Any], model: str | None) -> str | None:
        """Why the body's output budget is refused (a message naming the field), or None."""
        for field in _BUDGETS.get(route, ()):
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

    def _observe(self, call: Call) -> None:
        if self.metrics is not None:
            self.metrics.stats.observe(call.route, call.status, time.perf_counter() - call.t0, call.ttft)

    # ------------------------------------------------------------------ local answers

    def _models(self, conn: ClientConn, req: Request) -> None:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "motor"} for m in self.table.models()]
        conn.send(req, 200, orjson.dumps({"object": "list", "data": data}))

    def _count_tokens(self, conn: ClientConn, req: Request) -> None:
        from coordinator.anthropic import count_tokens

        try:
            body = orjson.loads(req.body)
        except orjson.JSONDecodeError as exc:
            self._error(conn, req, 400, f"request body is not valid JSON: {exc}", "invalid_json")
            return
        try:
            out = count_tokens(body)
        except CoordinatorError as exc:
            self._error(conn, req, exc.status, exc.message, exc.code)
            return
        conn.send(req, 200, orjson.dumps(out))

    # ------------------------------------------------------------------ helpers

    def _denied(self, conn: ClientConn, req: Request) -> bool:
        """Answer 401/403 and return True unless the request carries a key for a user route."""
        if not self.guard.enabled:
            return False
        denial = self.guard.check(Access.USER, req.headers.get)
        if denial is None:
            return False
        extra = [AUTHENTICATE] if denial.status == 401 else None
        self._error(conn, req, denial.status, denial.message, denial.code, extra)
        return True

    def _error(
        self,
        conn: ClientConn,
        req: Request,
        status: int,
        message: str,
        code: str | None = None,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        conn.send(req, status, error_for_path(req.path, status, message, code), extra=extra)
        if self.metrics is not None:
            route = _GENERATION.get(req.path, ("other", b""))[0]
            self.metrics.stats.count(route, status)
