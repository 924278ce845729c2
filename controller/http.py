"""The controller's HTTP: probes, Prometheus metrics and the observability API.

`create_app(service)` runs the service in the app's lifespan; everything a route needs comes
from the service object on `app.state` (typed through one dependency), never from globals.
With `controller.api_keys` set, every route but `/liveness`, `/readiness` (and `/metrics`
unless `public_metrics` is off) needs one of them; `/debug/state` masks secrets.

The views of the state are built and encoded in a worker thread, never on the event loop the
lease renewal runs on: a fleet's `/debug/state` takes seconds to build, and a leader that
cannot renew within `lease_ttl` is deposed. The state is immutable (`core.state`), so the
reference a handler takes is a consistent snapshot whatever the fold does meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

import orjson
from fastapi import Depends, FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from controller.errors import ControllerError, NotServing
from controller.service import ControllerService
from controller.views import alarms_view, instances_view, nodes_view
from core.http_errors import openai_error
from core.redact import redact
from core.state import state_to_dict
from http1.auth import METRICS, Access, Guard, GuardMiddleware

log = logging.getLogger(__name__)

_PROBES = frozenset({"/liveness", "/readiness"})
# Codes of the errors FastAPI's routing raises.
_ROUTING_CODES = {404: "not_found", 405: "method_not_allowed"}


def error_response(status: int, message: str, code: str | None) -> Response:
    """An OpenAI-shaped error response (`core.http_errors`)."""
    return Response(openai_error(status, message, code), status_code=status, media_type="application/json")


async def _json_off_loop(build: Callable[[], Any]) -> Response:
    """`build()` encoded as JSON, both in a worker thread."""
    body = await asyncio.to_thread(lambda: orjson.dumps(build(), option=orjson.OPT_NON_STR_KEYS))
    return Response(body, media_type="application/json")


def _service(request: Request) -> ControllerService:
    return request.app.state.service  # type: ignore[no-any-return]


Service = Annotated[ControllerService, Depends(_service)]


def create_app(
    service: ControllerService, on_failure: Callable[[BaseException], None] | None = None
) -> FastAPI:
    """The FastAPI app; its lifespan runs `service` until shutdown (`on_failure` if it dies)."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = asyncio.create_task(service.run(stop), name=f"controller-{service.id}")
        app.state.task = task

        def _ended(t: asyncio.Task[None]) -> None:
            if not stop.is_set() and not t.cancelled() and t.exception() is not None:
                exc = t.exception()
                assert exc is not None
                log.error("controller loop failed: %s", exc, exc_info=exc)
                if on_failure is not None:
                    on_failure(exc)

        task.add_done_callback(_ended)
        try:
            yield
        finally:
            stop.set()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 10.0)

    app = FastAPI(title="Motor controller", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service
    ctl = service.cfg.controller
    public = _PROBES | {METRICS} if ctl.public_metrics else _PROBES

    def access(path: str) -> Access:
        return Access.PUBLIC if path in public else Access.USER

    guard = Guard(ctl.api_keys, admin_field="controller.api_keys")
    app.add_middleware(GuardMiddleware, guard=guard, error_body=openai_error, access=access)

    @app.exception_handler(ControllerError)
    async def _ours(request: Request, exc: ControllerError) -> Response:
        return error_response(exc.status, exc.message, exc.code)

    @app.exception_handler(StarletteHTTPException)
    async def _routing(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            message = f"no route for {request.url.path}"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return error_response(exc.status_code, message, _ROUTING_CODES.get(exc.status_code))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error on %s", request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}", "internal_error")

    @app.get("/liveness")
    async def liveness(request: Request, svc: Service) -> Any:
        task: asyncio.Task[None] | None = getattr(request.app.state, "task", None)
        if task is None or task.done():
            why = "the controller loop has stopped"
            if task is not None and not task.cancelled() and task.exception() is not None:
                why += f": {task.exception()}"
            raise NotServing(why, code="not_alive")
        return {"status": "alive", "id": svc.id}

    @app.get("/readiness")
    async def readiness(svc: Service) -> Any:
        st = svc.status()
        if not st.caught_up:
            raise NotServing(f"controller {st.id} is still replaying the log", code="replaying")
        if not st.leader:
            raise NotServing(f"controller {st.id} is a standby (leader: {st.leader_id})", code="standby")
        return {"status": "ready", "id": st.id, "leader": True, "term": st.term, "seq": st.last_seq}

    @app.get("/metrics")
    async def metrics(svc: Service) -> Response:
        return Response(generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/instances")
    async def instances(svc: Service) -> Response:
        st, state = svc.status(), svc.state
        return await _json_off_loop(
            lambda: {
                "controller": {"id": st.id, "leader": st.leader, "leader_id": st.leader_id, "term": st.term},
                "seq": state.last_seq,
                "instances": instances_view(state),
                "nodes": nodes_view(state),
            }
        )

    @app.get("/v1/alarms")
    async def alarms(svc: Service) -> Response:
        state = svc.state
        return await _json_off_loop(lambda: {"seq": state.last_seq, **alarms_view(state)})

    @app.get("/debug/state")
    async def debug_state(svc: Service) -> Response:
        """The whole folded state as `motor replay --json` prints it (to compare the two), with
        secrets masked (`core.redact`): external instances carry whatever their registrar sent."""
        state = svc.state
        return await _json_off_loop(lambda: redact(state_to_dict(state)))

    return app
