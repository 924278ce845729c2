"""A minimal ASGI bridge: the management app (FastAPI) served by the proxy's own connections.

Management traffic is small, so a response is collected whole and written with a
Content-Length; one port serves /v1 and the management API. `Lifespan` runs the app's
startup and shutdown.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import ASGIApp, Message

from http1 import wire
from http1.request import Request
from http1.server import ClientConn

__all__ = ["ASGIApp", "Lifespan", "serve_asgi"]


async def serve_asgi(app: ASGIApp, conn: ClientConn, req: Request) -> None:
    """Run one request through `app` and write its response to `conn`.

    The app sees the request's normalised path: the one the proxy's checks saw.
    """
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": req.method.decode("ascii"),
        "scheme": "http",
        "path": req.path.decode("latin-1"),
        "raw_path": req.raw_path,
        "query_string": req.query,
        "root_path": "",
        "headers": list(req.headers.items()),
        # A Unix socket (the private probe socket) has a path, or nothing, for these.
        "client": conn.peer[:2] if isinstance(conn.peer, tuple) else None,
        "server": conn.sockname[:2] if isinstance(conn.sockname, tuple) else None,
        "state": {},
    }
    sent_body = False
    disconnected = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": req.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    status = 500
    headers: list[tuple[bytes, bytes]] = []
    body: list[bytes] = []

    async def send(message: Message) -> None:
        nonlocal status, headers
        t = message["type"]
        if t == "http.response.start":
            status = int(message["status"])
            headers = [(bytes(n).lower(), bytes(v)) for n, v in message.get("headers", [])]
        elif t == "http.response.body":
            chunk = message.get("body", b"")
            if chunk:
                body.append(bytes(chunk))

    try:
        await app(scope, receive, send)
    finally:
        disconnected.set()
    payload = b"".join(body)
    kept = [(n, v) for n, v in headers if n not in wire.HOP_BY_HOP]
    head = wire.build_head(status, kept, content_length=len(payload), keep_alive=req.keep_alive)
    conn.write(head if req.method == b"HEAD" else head + payload)


class Lifespan:
    """Drives an ASGI app's lifespan protocol (startup at `start`, shutdown at `stop`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._started: asyncio.Future[None] | None = None
        self._stopped: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Run the app's startup; raise if it fails."""
        loop = asyncio.get_running_loop()
        self._started = loop.create_future()
        self._stopped = loop.create_future()
        self._task = loop.create_task(self._run())
        await self._inbox.put({"type": "lifespan.startup"})
        await self._started

    async def stop(self) -> None:
        """Run the app's shutdown."""
        if self._task is None or self._stopped is None:
            return
        await self._inbox.put({"type": "lifespan.shutdown"})
        try:
            await asyncio.wait_for(asyncio.shield(self._stopped), 10)
        except (TimeoutError, RuntimeError):
            pass
        self._task.cancel()

    async def _run(self) -> None:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}

        async def send(message: Message) -> None:
            t = message["type"]
            if t == "lifespan.startup.complete" and self._started and not self._started.done():
                self._started.set_result(None)
            elif t == "lifespan.startup.failed" and self._started and not self._started.done():
                self._started.set_exception(RuntimeError(message.get("message", "startup failed")))
            elif t.startswith("lifespan.shutdown") and self._stopped and not self._stopped.done():
                self._stopped.set_result(None)

        try:
            await self.app(scope, self._inbox.get, send)
        except Exception as exc:  # an app without lifespan support
            if self._started is not None and not self._started.done():
                self._started.set_result(None)
            if self._stopped is not None and not self._stopped.done():
                self._stopped.set_result(None)
            del exc
