"""A management API over a real nats-server: the context fed by real followers, served by uvicorn.

The same wiring as the coordinator service, minus the /v1 proxy: MOTOR events and MOTOR_HB
heartbeats are followed into a `CoordinatorContext` (`coordinator.feed`), writes go through a
real `Publisher`, and the FastAPI app listens on a free port.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import uvicorn
from nats.aio.client import Client
from nats.js import JetStreamContext

from coordinator.context import CoordinatorContext
from coordinator.feed import follow_log
from coordinator.mgmt import create_mgmt_app
from core.coordconfig import CoordinatorConfig
from core.events import EventBase
from streams.jetstream import JetStreamLog
from streams.livefold import LiveFold
from streams.publisher import Publisher


@dataclass
class Harness:
    ctx: CoordinatorContext
    url: str
    http: aiohttp.ClientSession
    publisher: Publisher
    fold: LiveFold | None = None

    async def append(self, *events: EventBase) -> int:
        """Append events as their producers would, and wait until the table holds them."""
        seq = 0
        for ev in events:
            seq = await self.publisher.publish(ev)
        if seq:
            assert await self.ctx.wait_applied(seq, 20.0), f"table did not fold seq {seq}"
        return seq

    async def get(self, path: str) -> tuple[int, Any, aiohttp.typedefs.LooseHeaders]:
        async with self.http.get(self.url + path) as r:
            raw = await r.read()
            return r.status, _body(raw, r.content_type), r.headers

    async def post(self, path: str, body: Any = None, *, raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else orjson.dumps(body)
        async with self.http.post(
            self.url + path, data=data, headers={"Content-Type": "application/json"}
        ) as r:
            return r.status, _body(await r.read(), r.content_type)


def _body(raw: bytes, content_type: str) -> Any:
    if content_type == "application/json" and raw:
        return orjson.loads(raw)
    return raw


@contextlib.asynccontextmanager
async def running_mgmt(
    nc: Client, js: JetStreamContext, settings: CoordinatorConfig | None = None, *, follow: bool = True
) -> AsyncIterator[Harness]:
    """A management app over a context following the log; everything stopped on exit."""
    publisher = Publisher(js)
    ctx = CoordinatorContext(
        settings=settings or CoordinatorConfig(), publisher=publisher, source="coordinator/t"
    )
    fold = follow_log(ctx, JetStreamLog(nc), name="coordinator/t") if follow else None
    if fold is not None:
        await fold.start()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(create_mgmt_app(ctx), log_level="warning", lifespan="off", access_log=False)
    )
    serve = asyncio.create_task(server.serve(sockets=[sock]))
    http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    try:
        deadline = time.monotonic() + 20
        while not server.started:  # uvicorn offers no event to await for "listening"
            if serve.done():
                serve.result()
            if time.monotonic() > deadline:
                raise TimeoutError("management server did not start")
            await asyncio.sleep(0.01)
        yield Harness(ctx, f"http://127.0.0.1:{port}", http, publisher, fold)
    finally:
        await http.close()
        server.should_exit = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(serve, 10)
        if fold is not None:
            await fold.close()
        sock.close()
