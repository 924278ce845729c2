"""The management API (FastAPI): probes, metrics, instance refresh, precision alarms, the table.

Served in-process by the /v1 proxy (every path it does not own), or on `mgmt_port` when set.
While any key is configured, every route but the probes (and `/metrics`, unless
`public_metrics` is off) needs an admin key (`coordinator.admin_keys`), checked on the
normalised path the app routes on. The OpenAPI description is at `/openapi.json`. Writes (`/v1/instances/refresh`, `/precision/alarm_cleared`) are appended to
the log as events and answered once this replica's table has folded them (read your writes),
so every replica — and every replay — routes the same way. Every error is OpenAI-shaped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Annotated, Any

import orjson
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coordinator.choose import describe_plan
from coordinator.context import CoordinatorContext
from coordinator.enginemetrics import install_engine_metrics
from coordinator.errors import CoordinatorError
from coordinator.mgmt_schema import ALARM_BODY, ERRORS, REFRESH_BODY
from coordinator.refresh import validate_refresh
from core.coordconfig import CoordinatorConfig
from core.events import InstancesRefreshed, PrecisionAlarmCleared, PrecisionAlarmClearedData
from core.http_errors import openai_error
from core.ids import new_id
from http1.auth import METRICS, PROBES, Access, Guard, GuardMiddleware

log = logging.getLogger(__name__)

SERVICE = "Motor Coordinator Management Server"
VERSION = "1.0.0"
# How long a write waits for this replica's table to fold it before answering anyway: the
# event is durable once appended, the wait only buys read-your-writes.
APPLY_WAIT = 5.0
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def _ctx(request: Request) -> CoordinatorContext:
    ctx: CoordinatorContext = request.app.state.ctx
    return ctx


Ctx = Annotated[CoordinatorContext, Depends(_ctx)]


def _error(status: int, message: str, code: str | None = None, type_: str | None = None) -> Response:
    return Response(
        openai_error(status, message, code, type_=type_), status_code=status, media_type="application/json"
    )


def _json(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


async def _json_body(request: Request, ctx: CoordinatorContext) -> Any:
    """The request's JSON body; 413 over the limit, 400 when it is not JSON."""
    limit = ctx.settings.max_body_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise CoordinatorError(413, f"request body over the limit of {limit} bytes", code="body_too_large")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > limit:
            raise CoordinatorError(
                413, f"request body over the limit of {limit} bytes", code="body_too_large"
            )
    if not raw.strip():
        raise CoordinatorError(400, "body: a JSON object is required", code="invalid_json")
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise CoordinatorError(400, f"body: not valid JSON ({exc})", code="invalid_json") from None


async def _append(ctx: CoordinatorContext, event: InstancesRefreshed | PrecisionAlarmCleared) -> int:
    """Append an event to the log and wait (bounded) until this replica's table holds it."""
    if ctx.publisher is None:
        raise CoordinatorError(503, "not connected to the event log", code="no_event_log")
    try:
        seq = await ctx.publisher.publish(event)
    except Exception as exc:  # any publish failure is the log being unavailable to us
        log.warning("could not append %s: %s", event.type, exc)
        raise CoordinatorError(
            503, f"could not append to the event log: {exc}", code="event_log_unavailable"
        ) from None
    if not await ctx.wait_applied(seq, APPLY_WAIT):
        log.warning("%s appended at seq %d but not folded within %.0f s", event.type, seq, APPLY_WAIT)
    return seq


def mgmt_access(settings: CoordinatorConfig) -> Callable[[str], Access]:
    """What each management path needs (by normalised path): the app's middleware and the
    server core's head check (`coordinator.proxy.app`) both ask this."""
    # Metrics stay where a Prometheus scraper reaches them without a key, unless told otherwise.
    metrics = {METRICS, "/metrics/engines", "/instance/metrics"}
    public = PROBES | metrics if settings.public_metrics else PROBES

    def access(path: str) -> Access:
        return Access.PUBLIC if path in public else Access.ADMIN

    return access


def _guarded(ctx: CoordinatorContext) -> tuple[Guard, Callable[[str], Access]]:
    s = ctx.settings
    guard = Guard(s.api_keys, s.admin_keys, admin_field="coordinator.admin_keys")
    if s.api_keys and not s.admin_keys:
        log.warning("coordinator.api_keys is set but admin_keys is empty: management refuses every request")
    return guard, mgmt_access(s)


def create_mgmt_app(ctx: CoordinatorContext) -> FastAPI:
    """The management FastAPI app over one coordinator's context."""
    app = FastAPI(title=SERVICE, version=VERSION, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.ctx = ctx
    app.add_middleware(CatchAll)
    guard, access = _guarded(ctx)
    # Outermost: a request without the key never reaches a route (nor the catch-all).
    app.add_middleware(
        GuardMiddleware,
        guard=guard,
        access=access,
        error_body=openai_error,
    )
    _install_error_handlers(app)
    install_engine_metrics(app, ctx)  # /metrics/engines, /prometheus/targets (seed 002 metrics module)

    @app.get("/")
    async def root() -> Response:
        """What this server is and which management endpoints it has."""
        return _json(
            {
                "service": SERVICE,
                "version": VERSION,
                "description": "Management plane: liveness, startup, readiness, metrics, instance refresh",
                "endpoints": {
                    "GET /liveness": "liveness check",
                    "GET /startup": "startup probe",
                    "GET /readiness": "readiness check",
                    "GET /health": "ready to serve requests",
                    "GET /metrics": "Prometheus metrics",
                    "GET /v1/instances": "what the routing table routes",
                    "GET /v1/requests/{id}": "why a recent request went where (its routing record)",
                    "GET /v1/kvview": "what each engine caches, as kv_aware sees it",
                    "POST /instances/refresh": "refresh instances",
                    "POST /v1/instances/refresh": "refresh instances",
                    "POST /precision/alarm_cleared": "clear precision alarm scheduler state",
                },
            }
        )

    @app.get("/liveness")
    async def liveness(ctx: Ctx) -> Response:
        """The process answers."""
        return _json({"status": "ok", "uptime_s": round(time.time() - ctx.started_at, 3)})

    @app.get("/startup")
    async def startup(ctx: Ctx) -> Response:
        """Started once the table has replayed the log."""
        if not ctx.caught_up.is_set():
            return _error(503, "replaying the event log", "starting")
        return _json({"status": "ok", "log_seq": ctx.table.last_seq})

    @app.get("/readiness")
    async def readiness(ctx: Ctx) -> Response:
        """Ready once caught up with the log and some model has a routable instance."""
        return _ready(ctx)

    @app.get("/health")
    async def health(ctx: Ctx) -> Response:
        """Same as /readiness: a load balancer in front of replicas sends traffic only here."""
        return _ready(ctx)

    @app.get("/metrics")
    async def metrics(ctx: Ctx) -> Response:
        """Prometheus text format."""
        return Response(ctx.metrics.render(), media_type=PROMETHEUS_TEXT)

    @app.get("/v1/requests/{request_id}")
    async def request_record(request_id: str, ctx: Ctx) -> Response:
        """A recent request's routing record, by the coordinator's id or the client's x-request-id."""
        rec = ctx.recorder.find(request_id) if ctx.recorder is not None else None
        if rec is None:
            return _error(
                404,
                f"no recent request {request_id!r} on this coordinator (it keeps the last "
                f"{ctx.settings.decisions.ring}; `motor replay --request` reads MOTOR_REQ)",
                "not_found",
            )
        return Response(rec.data.model_dump_json(), media_type="application/json")

    @app.get("/v1/kvview")
    async def kvview(ctx: Ctx) -> Response:
        """The folded KV view: per endpoint its block size, block count and a digest of its blocks
        (replicas that folded the same bucket show the same digests)."""
        kv = ctx.kv
        return _json(
            {"object": "kvview", "version": kv.version, "undecodable": kv.undecodable, "data": kv.describe()}
        )

    @app.get("/v1/instances")
    async def instances(ctx: Ctx) -> Response:
        """Every endpoint the table knows, routable or not (and why), with its load."""
        t = ctx.table
        plans = {model: describe_plan(t.plan(model)) for model in t.models()}
        return _json(
            {
                "object": "list",
                "version": t.version,
                "log_seq": t.last_seq,
                "caught_up": ctx.caught_up.is_set(),
                "plans": plans,
                "data": t.describe(),
            }
        )

    async def refresh(request: Request, ctx: Ctx) -> Response:
        """Seed 001: validate, append `instances.refreshed`, answer 200 with no body."""
        try:
            data = validate_refresh(await _json_body(request, ctx))
        except CoordinatorError:
            ctx.metrics.refreshes.labels(result="rejected").inc()
            raise
        event = InstancesRefreshed(id=new_id(), ts=time.time(), source=ctx.source, data=data)
        await _append(ctx, event)
        ctx.metrics.refreshes.labels(result="accepted").inc()
        return Response(status_code=200)

    doc = {"requestBody": REFRESH_BODY, "responses": ERRORS}
    app.add_api_route("/v1/instances/refresh", refresh, methods=["POST"], openapi_extra=doc)
    app.add_api_route("/instances/refresh", refresh, methods=["POST"], openapi_extra=doc)

    @app.post("/precision/alarm_cleared", openapi_extra={"requestBody": ALARM_BODY, "responses": ERRORS})
    async def alarm_cleared(request: Request, ctx: Ctx) -> Response:
        """Seed 002: clear the precision alarm of a P/D group (`{d_instance_id, p_instance_id?}`)."""
        body = await _json_body(request, ctx)
        if not isinstance(body, dict):
            raise CoordinatorError(400, "body: must be a JSON object", code="invalid_field")
        d_id = _instance_id(body.get("d_instance_id"), "d_instance_id", required=True)
        p_id = _instance_id(body.get("p_instance_id"), "p_instance_id", required=False)
        assert d_id is not None
        current = ctx.table.state.alarms.get(d_id)
        event = PrecisionAlarmCleared(
            id=new_id(),
            ts=time.time(),
            source=ctx.source,
            data=PrecisionAlarmClearedData(
                d_instance_id=d_id,
                p_instance_id=p_id,
                alarm_id=current.data.alarm_id if current is not None else None,
                reason="cleared through the management API",
            ),
        )
        await _append(ctx, event)
        ctx.metrics.alarm_clears.inc()
        return _json(
            {
                "request_id": "precision_alarm_cleared",
                "status": "success",
                "message": "Precision alarm state cleared",
                "data": {"dismissed": current is not None},
            }
        )

    return app


def _instance_id(value: Any, field: str, *, required: bool) -> int | None:
    if value is None:
        if required:
            raise CoordinatorError(400, f"{field}: is required", code="invalid_field")
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CoordinatorError(
            400, f"{field}: must be a non-negative integer, got {value!r}", code="invalid_field"
        )
    return value


def _ready(ctx: CoordinatorContext) -> Response:
    ready, reason = ctx.readiness()
    if not ready:
        return _error(503, reason, "not_ready")
    return _json(
        {"status": "ok", "log_seq": ctx.table.last_seq, "routable_endpoints": len(ctx.table.routable())}
    )


def _install_error_handlers(app: FastAPI) -> None:
    """Every error leaves OpenAI-shaped, never as a stack trace."""

    @app.exception_handler(CoordinatorError)
    async def coordinator_error(request: Request, exc: CoordinatorError) -> Response:
        return Response(
            exc.body(), status_code=exc.status, media_type="application/json", headers=exc.headers
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            message = f"no route for {request.url.path}"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return _error(exc.status_code, message, headers_code(exc.status_code))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        field = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        return _error(400, f"{field}: {first.get('msg', 'invalid')}", "invalid_field")


class CatchAll:
    """Pure ASGI middleware: an unexpected exception becomes an OpenAI-shaped 500, not a re-raise.

    Starlette's own last-resort handler answers and then re-raises, which an in-process ASGI
    bridge (the proxy's) would see as a failed request with no response.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            log.exception("management request %s %s failed", scope.get("method"), scope.get("path"))
            if started:
                return  # a response is under way; nothing sane to add
            body = openai_error(500, f"internal error: {type(exc).__name__}")
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({"type": "http.response.start", "status": 500, "headers": headers})
            await send({"type": "http.response.body", "body": body})


def headers_code(status: int) -> str | None:
    """OpenAI-style error code for a routing status."""
    return {404: "not_found", 405: "method_not_allowed"}.get(status)
