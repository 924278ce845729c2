"""What a client of an SGLang or vLLM server calls beyond the OpenAI routes (seed 003).

`/generate` (SGLang native), `/v1/score`, `/v1/rerank` and vLLM's `/tokenize` / `/detokenize`
pass through to an engine that serves them, with the same routing, retries and breakers as
`/v1` generation; `GET /v1/models/{id}` is answered here from the routing table. Which
engine types serve a route is a table (`ROUTES`): a route no known engine serves is a 501
naming it; one whose engines are all down is a 503. A route a P/D adapter can split
(`/generate`: SGLang's bootstrap, the same fields as chat) runs over a prefill/decode pair
that speaks it, through the same flows and adapter as /v1.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

import orjson

from coordinator.adapters import splitting
from coordinator.endpoint import Endpoint, Plan
from coordinator.plan import Serves, make_plan
from coordinator.policies import RequestInfo
from coordinator.proxy.call import RESERVED, Call, Retry, client_request_id
from core.events import Role
from http1.request import Request
from http1.server import ClientConn

if TYPE_CHECKING:
    from coordinator.proxy.app import ProxyApp

MODEL_PREFIX = b"/v1/models/"


@dataclass(frozen=True, slots=True)
class NativeRoute:
    """One pass-through route: its metrics name, the engines that serve it, where it may go."""

    name: str
    engines: frozenset[str]
    roles: tuple[Role, ...]  # single-hop roles, in order of preference
    pd: tuple[str, ...] = ()  # the P/D capabilities whose adapters can split it

    @property
    def plan_rules(self) -> Serves:
        return Serves(self.engines, self.roles, self.pd)

    def serves(self, ep: Endpoint) -> bool:
        """Whether this endpoint's engine serves the route, in a role it may be sent to."""
        return ep.engine_type in self.engines and (ep.role in self.roles or bool(self.pd))


_ANY = (Role.UNION, Role.PREFILL, Role.DECODE)
ROUTES: dict[bytes, NativeRoute] = {
    b"/generate": NativeRoute(
        "generate", frozenset({"sglang", "builtin"}), (Role.UNION,), pd=splitting(b"/generate")
    ),
    b"/v1/score": NativeRoute("score", frozenset({"sglang", "vllm", "builtin"}), (Role.UNION, Role.PREFILL)),
    b"/v1/rerank": NativeRoute(
        "rerank", frozenset({"sglang", "vllm", "builtin"}), (Role.UNION, Role.PREFILL)
    ),
    b"/tokenize": NativeRoute("tokenize", frozenset({"vllm", "builtin"}), _ANY),
    b"/detokenize": NativeRoute("detokenize", frozenset({"vllm", "builtin"}), _ANY),
}


def handles(path: bytes) -> bool:
    """Whether the path is one of these routes."""
    return path in ROUTES or path.startswith(MODEL_PREFIX)


def choose(routable: tuple[Endpoint, ...], route: NativeRoute, model: str | None) -> Plan:
    """P/D when an adapter splits the route and both halves speak it, else a single hop, else none."""
    eps = [e for e in routable if model is None or e.model == model]
    return make_plan(eps, model, lambda: "none", route.plan_rules)


class NativeRoutes:
    """The handler the proxy app hands these paths to."""

    def __init__(self, app: ProxyApp) -> None:
        self.app = app

    async def __call__(self, conn: ClientConn, req: Request) -> None:
        app = self.app
        if app._denied(conn, req):
            return
        if req.path.startswith(MODEL_PREFIX):
            self._model(conn, req)
            return
        route = ROUTES[req.path]
        if req.method != b"POST":
            app._error(conn, req, 405, f"{req.path.decode()} takes POST")
            return
        if req.too_large:
            app._error(conn, req, 413, f"request body over the limit of {conn.max_body} bytes")
            return
        limiter = app.limiter
        if limiter is not None:
            refusal = limiter.try_acquire()
            if refusal is not None:
                retry = [(b"retry-after", refusal.header.encode())]
                app._error(conn, req, 429, refusal.message, "rate_limit_exceeded", retry)
                return
        try:
            await self._routed(conn, req, route)
        finally:
            if limiter is not None:
                limiter.release()

    def _model(self, conn: ClientConn, req: Request) -> None:
        name = req.path[len(MODEL_PREFIX) :].decode("latin-1")
        if req.method != b"GET":
            self.app._error(conn, req, 405, "/v1/models/{model} takes GET")
        elif not self.app.table.has_model(name):
            self.app._error(conn, req, 404, f"model {name!r} is not served here", "model_not_found")
        else:
            conn.send(
                req, 200, orjson.dumps({"id": name, "object": "model", "created": 0, "owned_by": "motor"})
            )

    async def _routed(self, conn: ClientConn, req: Request, route: NativeRoute) -> None:
        app = self.app
        path = req.path.decode()
        try:
            body = orjson.loads(req.body)
        except orjson.JSONDecodeError as exc:
            app._error(conn, req, 400, f"request body is not valid JSON: {exc}", "invalid_json")
            return
        if not isinstance(body, dict):
            app._error(conn, req, 400, "request body must be a JSON object", "invalid_json")
            return
        model = body.get("model")
        if model is not None and (not isinstance(model, str) or not app.table.has_model(model)):
            app._error(conn, req, 404, f"model {model!r} is not served here", "model_not_found")
            return
        plan = choose(app.table.routable(), route, model)
        if plan.kind == "none":
            self._unserved(conn, req, route, path, model)
            return
        raw = req.body
        if not RESERVED.isdisjoint(body):  # engine ids and P/D peers are the coordinator's to set
            body = {k: v for k, v in body.items() if k not in RESERVED}
            raw = orjson.dumps(body)
        root = req.rid = app._next_id()
        call = Call(conn, req, route.name, req.path, body, raw, root, client_request_id(req.headers))
        task = app._deadline(call) if app.request_timeout is not None else None
        try:
            if plan.kind == "pd":
                await app.flows.run(call, plan)
            else:
                assert plan.role is not None
                await self._single(call, route, plan.role)
        except asyncio.CancelledError:
            if task is None or task not in app._expired:
                if app.metrics is not None:
                    app.metrics.aborts.labels(route=route.name).inc()
                raise
            # The coordinator's request timeout (as on /v1): answer if nothing went out yet.
            app._expired.discard(task)
            task.uncancel()
            if call.committed:
                conn.close()
            else:
                msg = f"no complete answer within the request timeout of {app.request_timeout:g} s"
                app._error(conn, req, 504, msg, "request_timeout")
            call.status = 504
        finally:
            if task is not None:
                app._deadlines.pop(task, None)
        app._observe(call)

    async def _single(self, call: Call, route: NativeRoute, role: Role) -> None:
        flows = self.app.flows
        policy = flows.policies[role]
        info = RequestInfo(call.model, b"", call.root)
        last: Retry | None = None
        for attempt in range(1, flows.retries + 2):
            flows.readmit(call)
            cands = [e for e in self.app.table.candidates(role, call.model) if route.serves(e)]
            ep = policy.select(cands, info, call.exclude)
            if ep is None:
                break
            try:
                await flows.serve_on(call, ep, call.raw, call.request_id(attempt))
                return
            except Retry as r:
                call.exclude.add(ep.key)
                last = r
                flows.retried(r)
        model = f" for model {call.model!r}" if call.model else ""
        flows.fail(call, last, f"no routable {role.value} endpoint serving {call.path.decode()}{model}")

    def _unserved(
        self, conn: ClientConn, req: Request, route: NativeRoute, path: str, model: str | None
    ) -> None:
        """501 when no known engine serves the route at all, 503 when they are all down."""
        known = [row for row in self.app.table.describe() if model is None or row["model"] == model]
        types = sorted({row["engine_type"] for row in known})
        if any(row["engine_type"] in route.engines for row in known):
            msg = f"{path}: no routable {'/'.join(sorted(route.engines))} engine right now"
            self.app._error(conn, req, 503, msg, "no_routable_instance")
            return
        behind = ", ".join(types) if types else "none"
        msg = (
            f"{path} is not served by the engines behind this coordinator (engine types: {behind}); "
            f"it needs {' or '.join(sorted(route.engines))}"
        )
        self.app._error(conn, req, 501, msg, "route_not_supported")
