"""The agent's HTTP side: `/node-manager/status`, `/readiness`, `/liveness`, `/metrics`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from nodeagent.metrics import AgentMetrics


@dataclass(frozen=True, slots=True)
class HttpView:
    """What the handlers read; functions, so the app never holds agent internals."""

    status: Callable[[], dict[str, Any]]
    ready: Callable[[], bool]
    alive: Callable[[], bool]
    metrics: AgentMetrics


VIEW = web.AppKey("view", HttpView)


async def _status(request: web.Request) -> web.Response:
    return web.json_response(request.app[VIEW].status())


async def _readiness(request: web.Request) -> web.Response:
    ready = request.app[VIEW].ready()
    return web.json_response({"ready": ready}, status=200 if ready else 503)


async def _liveness(request: web.Request) -> web.Response:
    alive = request.app[VIEW].alive()
    return web.json_response({"alive": alive}, status=200 if alive else 503)


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[VIEW].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def create_app(view: HttpView) -> web.Application:
    """The aiohttp application of one agent."""
    app = web.Application()
    app[VIEW] = view
    app.router.add_get("/node-manager/status", _status)
    app.router.add_get("/readiness", _readiness)
    app.router.add_get("/liveness", _liveness)
    app.router.add_get("/metrics", _metrics)
    return app


async def serve(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving; return the runner (for cleanup) and the bound port (port 0 picks one)."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname()[1] if sockets else port
    return runner, int(bound)
