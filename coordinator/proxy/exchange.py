"""Talking to engines: request heads, an exchange that survives a stale pooled connection,
whole-body fetches (prefill legs) and best-effort aborts.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson

from coordinator.proxy.pool import UpstreamPool
from coordinator.proxy.upstream import UpstreamConn, UpstreamError
from coordinator.table import Endpoint

log = logging.getLogger(__name__)


def request_head(ep: Endpoint, path: bytes, length: int, request_id: str) -> bytes:
    """The head of a POST to an engine (our own minimal header set)."""
    return (
        b"POST %b HTTP/1.1\r\nhost: %b:%d\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nx-request-id: %b\r\n\r\n"
        % (path, ep.host.encode(), ep.port, length, request_id.encode())
    )


class Upstreams:
    """Opens exchanges with engines over the shared keep-alive pool."""

    def __init__(
        self, pool: UpstreamPool, *, first_token_timeout: float, inter_token_timeout: float | None = None
    ) -> None:
        self.pool = pool
        self.first_token_timeout = first_token_timeout
        pool.inter_token_timeout = inter_token_timeout
        self._background: set[asyncio.Task[Any]] = set()

    async def open(self, ep: Endpoint, path: bytes, body: bytes, request_id: str) -> UpstreamConn:
        """Send a request; return once the engine sent its head and first body bytes.

        A pooled connection the engine closed meanwhile fails without a byte: that one case
        is retried once on a fresh connection (the request cannot have been seen).
        """
        data = request_head(ep, path, len(body), request_id) + body
        conn = self.pool.take(ep.host, ep.port) or await self.pool.connect(ep.host, ep.port)
        try:
            await conn.send(data, self.first_token_timeout)
            return conn
        except UpstreamError as exc:
            if not (conn.reused and not exc.got_bytes and not exc.timeout):
                raise
        except BaseException:
            conn.close()
            raise
        conn = await self.pool.connect(ep.host, ep.port)
        try:
            await conn.send(data, self.first_token_timeout)
        except BaseException:
            conn.close()
            raise
        return conn

    async def fetch(self, ep: Endpoint, path: bytes, body: bytes, request_id: str) -> tuple[int, bytes]:
        """A whole exchange: (status, decoded body)."""
        conn = await self.open(ep, path, body, request_id)
        try:
            data = await conn.read_all()
        except BaseException:
            conn.close()
            raise
        status = conn.status
        conn.release()
        return status, data

    def abort(self, ep: Endpoint, request_id: str) -> None:
        """Best effort `POST /abort_request` in the background (SGLang's native abort)."""
        task = asyncio.get_running_loop().create_task(self._abort(ep, request_id))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _abort(self, ep: Endpoint, request_id: str) -> None:
        body = orjson.dumps({"rid": request_id})
        try:
            status, _ = await asyncio.wait_for(self.fetch(ep, b"/abort_request", body, request_id), 5.0)
            log.debug("abort %s on %s: HTTP %d", request_id, ep.key, status)
        except (UpstreamError, TimeoutError) as exc:
            log.info("abort %s on %s failed: %s", request_id, ep.key, exc)

    async def close(self) -> None:
        """Wait for pending aborts (briefly) and close idle connections."""
        if self._background:
            await asyncio.wait(list(self._background), timeout=2.0)
        self.pool.close()
