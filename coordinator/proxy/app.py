"""The coordinator's request handler: a client route (`routes.ROUTES`: the `/v1` generation
routes and the engine-native ones) goes to the pipeline; `/v1/models`, `/v1/models/{id}` and
Anthropic's `count_tokens` are answered here from the routing table; every other path goes to
the management app in-process (which checks admin keys itself), or, when management has its
own port, only the probes do.

Routing and key checks both use the request's normalised path (`Request.path`). Errors on the
Anthropic routes are Anthropic-shaped, every other one OpenAI-shaped.

`head` is the server core's head check (`http1.server`): the key check of the route a path
goes to (a client route or a model view: a user key; a management path: what the management
app asks), on the head, before the body is read. The handlers check again on the whole
request (admission, the management middleware): the same `Guard`, so the two cannot differ.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import orjson

from coordinator.anthropic import count_tokens
from coordinator.errors import CoordinatorError, error_for_path
from coordinator.metrics import CoordinatorMetrics
from coordinator.proxy.admit import Refused, denial
from coordinator.proxy.asgi import ASGIApp, serve_asgi
from coordinator.proxy.pipeline import Pipeline
from coordinator.proxy.routes import ROUTES
from coordinator.table import RoutingTable
from http1.auth import PROBES, Access, Denial, Guard, Pass
from http1.request import Request
from http1.server import ClientConn

MODELS = b"/v1/models"
MODEL_PREFIX = b"/v1/models/"
COUNT_TOKENS = b"/v1/messages/count_tokens"
_PROBES = frozenset(p.encode() for p in PROBES)


class ProxyApp:
    """The request handler the protocol server calls for every request."""

    def __init__(
        self,
        pipeline: Pipeline,
        table: RoutingTable,
        guard: Guard,
        *,
        metrics: CoordinatorMetrics | None = None,
        mgmt_app: ASGIApp | None = None,
        mgmt_probes_only: bool = False,
        mgmt_access: Callable[[str], Access] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.table = table
        self.guard = guard
        self.metrics = metrics
        self.mgmt = mgmt_app
        # With management on its own port, this port hands the management app only the probes.
        self.mgmt_probes_only = mgmt_probes_only
        # What a management path needs (`coordinator.mgmt.mgmt_access`); None: admin keys.
        self.mgmt_access = mgmt_access

    def head(self, path: bytes, headers: dict[bytes, bytes]) -> Denial | Pass:
        """The key check of the route `path` goes to, on the request's head (`http1.server`)."""
        here = path in ROUTES or path in (MODELS, COUNT_TOKENS) or path.startswith(MODEL_PREFIX)
        if not here and self.mgmt is not None and (not self.mgmt_probes_only or path in _PROBES):
            name = path.decode("latin-1")
            access = self.mgmt_access(name) if self.mgmt_access is not None else Access.ADMIN
            return self.guard.judge(access, headers.get)
        # A client route, a model view, or no route at all (its 404 is for keyed clients).
        return self.guard.judge(Access.USER, headers.get)

    def __call__(self, conn: ClientConn, req: Request) -> Awaitable[None] | None:
        # Returns the pipeline's coroutine (the server runs it as the request's task) or None
        # for an answer given at once, which needs no task at all.
        path = req.path
        route = ROUTES.get(path)
        if route is not None:
            return self.pipeline.serve(conn, req, route)
        if path in (MODELS, COUNT_TOKENS) or path.startswith(MODEL_PREFIX):
            refused = denial(self.guard, req)
            if refused is not None:
                self._error(conn, req, refused)
            elif path == MODELS:
                self._models(conn, req)
            elif path == COUNT_TOKENS:
                self._count_tokens(conn, req)
            else:
                self._model(conn, req)
            return None
        if self.mgmt is not None and (not self.mgmt_probes_only or path in _PROBES):
            return serve_asgi(self.mgmt, conn, req)
        self._error(conn, req, Refused(404, f"no route for {path.decode('latin-1')}", "not_found"))
        return None

    def _models(self, conn: ClientConn, req: Request) -> None:
        data = [_model_card(m) for m in self.table.models()]
        conn.send(req, 200, orjson.dumps({"object": "list", "data": data}))

    def _model(self, conn: ClientConn, req: Request) -> None:
        name = req.path[len(MODEL_PREFIX) :].decode("latin-1")
        if req.method != b"GET":
            self._error(conn, req, Refused(405, "/v1/models/{model} takes GET", "method_not_allowed"))
        elif not self.table.has_model(name):
            self._error(conn, req, Refused(404, f"model {name!r} is not served here", "model_not_found"))
        else:
            conn.send(req, 200, orjson.dumps(_model_card(name)))

    def _count_tokens(self, conn: ClientConn, req: Request) -> None:
        try:
            body = orjson.loads(req.body)
        except orjson.JSONDecodeError as exc:
            self._error(conn, req, Refused(400, f"request body is not valid JSON: {exc}", "invalid_json"))
            return
        try:
            out = count_tokens(body)
        except CoordinatorError as exc:
            self._error(conn, req, Refused(exc.status, exc.message, exc.code))
            return
        conn.send(req, 200, orjson.dumps(out))

    def _error(self, conn: ClientConn, req: Request, r: Refused) -> None:
        conn.send(req, r.status, error_for_path(req.path, r.status, r.message, r.code), extra=r.headers)
        if self.metrics is not None:
            self.metrics.stats.count("other", r.status)


def _model_card(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "motor"}
