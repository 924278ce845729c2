"""`POST /v1/metaserver` (seed 000): hand a request to the P/D peer and relay its answer.

Used by Motor's P/D flows where one engine triggers its peer: a decode engine asking the
prefill engine to prefill, or a prefill engine asking the decode engine to decode. The peer is
named in `kv_transfer_params` (`remote_host`, `remote_port`); its answer, streamed or not,
is passed back unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from simengine.openai_api import ApiError
from simengine.router import Response

_REQUIRED = ("request_id", "remote_engine_id", "remote_host", "remote_port")


def _target(body: dict[str, Any]) -> str:
    if not isinstance(body.get("model"), str):
        raise ApiError(400, "model is required", param="model")
    if ("messages" in body) == ("prompt" in body):
        raise ApiError(400, "exactly one of messages and prompt is required", param="messages")
    kv = body.get("kv_transfer_params")
    if not isinstance(kv, dict):
        raise ApiError(400, "kv_transfer_params is required", param="kv_transfer_params")
    missing = [k for k in _REQUIRED if kv.get(k) in (None, "")]
    if missing:
        raise ApiError(400, f"kv_transfer_params needs {missing}", param="kv_transfer_params")
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"
    return f"http://{kv['remote_host']}:{kv['remote_port']}{path}"


class MetaServer:
    """Forwards metaserver requests to the peer engine."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    async def forward(self, body: dict[str, Any]) -> Response:
        """Send `body` to the peer named in it; its status and body become ours."""
        url = _target(body)
        if self._session is None:
            self._session = aiohttp.ClientSession()
        try:
            resp = await self._session.post(
                url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}
            )
        except (aiohttp.ClientError, OSError) as exc:
            raise ApiError(502, f"cannot reach the peer engine at {url}: {exc!r}") from None
        ctype = resp.headers.get("Content-Type", "application/json")
        if not body.get("stream"):
            raw = await resp.read()
            resp.release()
            return Response(resp.status, raw, ctype)
        return Response(resp.status, content_type=ctype, stream=_relay(resp))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _relay(resp: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    try:
        async for chunk in resp.content.iter_any():
            yield chunk
    finally:
        resp.release()
