"""vLLM-style P/D handoff: the prefill keeps the "KV", the decode fetches it over HTTP.

A prefill request with `kv_transfer_params.do_remote_decode=true` keeps its blocks for
`kv_ttl_s` and answers with the `kv_transfer_params` a NIXL-connector vLLM would send. The
decode request carries those params; the decode engine pulls the KV from the prefill engine's
internal endpoint (`POST /internal/kv/transfer`), which checks that the KV exists, belongs to
that engine and those blocks, and was computed for the same prompt, then frees it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from simengine.engine import Engine, Job
from simengine.kvcache import Allocation
from simengine.openai_api import ApiError

log = logging.getLogger(__name__)

TRANSFER_PATH = "/internal/kv/transfer"
_KV_ERROR = "KVTransferError"


@dataclass(slots=True)
class _Held:
    alloc: Allocation
    digest: bytes
    prompt_len: int
    timer: asyncio.TimerHandle


def wants_remote_decode(job: Job) -> bool:
    """A prefill request of the vLLM handoff protocol."""
    kv = job.g.kv_transfer
    return bool(kv and kv.get("do_remote_decode"))


def wants_remote_prefill(job: Job) -> bool:
    """A decode request of the vLLM handoff protocol."""
    kv = job.g.kv_transfer
    return bool(kv and kv.get("do_remote_prefill"))


class HandoffStore:
    """The prefill side: KV kept for decode engines to fetch, each for a bounded time."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._held: dict[str, _Held] = {}

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, job: Job) -> dict[str, Any]:
        """Keep the job's blocks and return the `kv_transfer_params` for the decode side."""
        s = self._engine.settings
        alloc = self._engine.take_blocks(job)
        rid = job.g.rid
        if rid in self._held:
            rid = f"{rid}-{id(job):x}"
        loop = asyncio.get_running_loop()
        timer = loop.call_later(s.kv_ttl_s, self._expire, rid)
        self._held[rid] = _Held(alloc, job.digest, job.prompt_len, timer)
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_engine_id": s.engine_id,
            "remote_block_ids": list(alloc.blocks),
            "remote_request_id": rid,
            "remote_host": s.public_host,
            "remote_port": s.port,
            "tp_size": 1,
        }

    def _expire(self, rid: str) -> None:
        held = self._held.pop(rid, None)
        if held is not None:
            log.info(
                "KV of %s expired after %.1fs without a decode fetching it",
                rid,
                self._engine.settings.kv_ttl_s,
            )
            self._engine.release(held.alloc)

    def transfer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Serve a decode engine's fetch: (HTTP status, JSON answer); frees the KV on success."""
        rid = body.get("remote_request_id")
        engine_id = body.get("remote_engine_id")
        if engine_id != self._engine.settings.engine_id:
            return 409, {
                "error": f"engine id {engine_id!r} is not this engine ({self._engine.settings.engine_id})"
            }
        held = self._held.get(rid) if isinstance(rid, str) else None
        if held is None or not isinstance(rid, str):
            return 404, {"error": f"no KV for request {rid!r} (expired after the TTL, or already fetched)"}
        if body.get("remote_block_ids") != held.alloc.blocks:
            return 409, {"error": f"block ids do not match the KV of request {rid!r}"}
        if body.get("prompt_digest") != held.digest.hex() or body.get("prompt_tokens") != held.prompt_len:
            return 409, {"error": f"the KV of request {rid!r} was computed for a different prompt"}
        del self._held[rid]
        held.timer.cancel()
        self._engine.release(held.alloc)
        return 200, {"num_tokens": held.prompt_len, "num_blocks": len(held.alloc.blocks)}

    def clear(self) -> None:
        """Drop everything held (shutdown)."""
        for held in self._held.values():
            held.timer.cancel()
            self._engine.release(held.alloc)
        self._held.clear()


class HandoffClient:
    """The decode side: fetch the KV a prefill engine holds for this request."""

    def __init__(self, timeout_s: float = 10.0) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def fetch(self, job: Job) -> None:
        """Pull the remote KV or raise an `ApiError` that says why it cannot be had."""
        kv = job.g.kv_transfer or {}
        missing = [
            k
            for k in ("remote_engine_id", "remote_request_id", "remote_host", "remote_port")
            if not kv.get(k)
        ]
        if missing:
            raise ApiError(
                400,
                f"kv_transfer_params with do_remote_prefill need {missing}",
                _KV_ERROR,
                "kv_transfer_params",
            )
        if not isinstance(kv.get("remote_block_ids", []), list):
            raise ApiError(
                400, "kv_transfer_params.remote_block_ids must be a list", _KV_ERROR, "kv_transfer_params"
            )
        url = f"http://{kv['remote_host']}:{kv['remote_port']}{TRANSFER_PATH}"
        payload = {
            "remote_request_id": kv["remote_request_id"],
            "remote_engine_id": kv["remote_engine_id"],
            "remote_block_ids": kv.get("remote_block_ids", []),
            "prompt_digest": job.digest.hex(),
            "prompt_tokens": job.prompt_len,
        }
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.post(url, data=orjson.dumps(payload)) as resp:
                answer = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiError(
                502, f"cannot reach prefill engine at {url} for the KV: {exc!r}", _KV_ERROR
            ) from None
        if status == 200:
            job.remote_kv = True
            return
        try:
            why = orjson.loads(answer).get("error", answer.decode(errors="replace"))
        except (orjson.JSONDecodeError, AttributeError):
            why = answer.decode(errors="replace")
        if status == 404:
            raise ApiError(410, f"remote KV is gone: {why}", _KV_ERROR, "kv_transfer_params")
        if status == 409:
            raise ApiError(
                400, f"remote KV does not match this request: {why}", _KV_ERROR, "kv_transfer_params"
            )
        raise ApiError(502, f"prefill engine answered {status} to the KV fetch: {why}", _KV_ERROR)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
