"""vLLM's P/D handoff: prefill with `max_tokens=1` for a remote decode, then decode with its KV.

The prefill leg gets a copy of the client's body asking the KV connector to keep the KV for a
remote decode (`do_remote_decode`), answering in one JSON body (no stream) after one token.
Its response carries `kv_transfer_params` (where the KV lives); the decode leg gets the
client's original body plus exactly those params, and its response is the client's.
Both legs carry the same engine request id. A prefill that refuses the request (4xx) is the
client's answer: the request itself is bad, another path would refuse it too.
"""

from __future__ import annotations

from typing import Any

import orjson

from coordinator.adapters.base import PairAttempt
from coordinator.endpoint import Endpoint

CAPABILITY = "handoff"

PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def prefill_body(body: dict[str, Any], request_id: str) -> dict[str, Any]:
    """The prefill leg's body: one token, no stream, KV kept for a remote decode."""
    out = dict(body)
    out["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out.pop("stream_options", None)
    out.pop("min_tokens", None)
    out["request_id"] = request_id
    return out


def decode_body(
    body: dict[str, Any], kv_transfer_params: dict[str, Any] | None, request_id: str
) -> dict[str, Any]:
    """The decode leg's body: the client's body plus the prefill response's KV params."""
    out = dict(body)
    if kv_transfer_params is not None:
        out["kv_transfer_params"] = kv_transfer_params
    else:
        out.pop("kv_transfer_params", None)
    out["request_id"] = request_id
    return out


def kv_params_of(prefill_response: Any) -> dict[str, Any] | None:
    """The `kv_transfer_params` of a prefill response, if it is a dict."""
    if isinstance(prefill_response, dict):
        kv = prefill_response.get("kv_transfer_params")
        if isinstance(kv, dict):
            return kv
    return None


class Handoff:
    """The handoff protocol, run whole: prefill for one token, then decode with the prefill's KV."""

    capability = CAPABILITY
    native_paths: frozenset[bytes] = frozenset()  # the body rewrite knows OpenAI bodies only

    async def run(self, at: PairAttempt, prefill: Endpoint, decode: Endpoint) -> None:
        """Prefill leg whole, then the decode leg delivered to the client."""
        status, data = await at.prefill_leg(prefill, orjson.dumps(prefill_body(at.body, at.rid)))
        if status >= 400:
            at.refused(status, data)
            return
        try:
            kv = kv_params_of(orjson.loads(data))
        except orjson.JSONDecodeError:
            kv = None
        await at.serve(decode, orjson.dumps(decode_body(at.body, kv, at.rid)))
