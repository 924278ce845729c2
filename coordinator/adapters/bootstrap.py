"""SGLang's P/D bootstrap: the same request to prefill and decode at once, met in a room.

Both legs get `bootstrap_host` (the prefill host), `bootstrap_port` (the prefill endpoint's
registered bootstrap port) and `bootstrap_room` (a stable 63-bit hash of the pair id and the
attempt), so the decode engine pulls the KV the prefill engine computes. The client sees the
decode response; if either leg fails the other is aborted (`POST /abort_request`). The fields
are the same on SGLang's native `/generate`, so this adapter splits that route too.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from coordinator.adapters.base import PairAttempt
from coordinator.endpoint import Endpoint
from coordinator.proxy.outcome import Broken, Retry
from core.ids import room_id

CAPABILITY = "bootstrap"


class BootstrapError(ValueError):
    """The prefill endpoint registered no bootstrap port."""


def pd_bodies(
    body: dict[str, Any],
    *,
    prefill_host: str,
    bootstrap_port: int | None,
    pair_id: str,
    attempt: int,
    request_id: str,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(prefill body, decode body) for one attempt of one pair."""
    if bootstrap_port is None:
        raise BootstrapError(f"prefill endpoint {prefill_host} registered no bootstrap_port")
    extra = {
        "bootstrap_host": prefill_host,
        "bootstrap_port": bootstrap_port,
        "bootstrap_room": room_id(pair_id, attempt),
        "rid": request_id,
        "request_id": request_id,
    }
    prefill = {**body, **extra}
    decode = {**body, **extra}
    return prefill, decode


class Bootstrap:
    """The bootstrap protocol, run whole: both legs at once; the client gets the decode stream."""

    capability = CAPABILITY
    native_paths = frozenset({b"/generate"})

    async def run(self, at: PairAttempt, prefill: Endpoint, decode: Endpoint) -> None:
        """Both legs at once; a prefill that fails first stops the decode waiting for its KV."""
        p, d = prefill, decode
        try:
            pbody, dbody = pd_bodies(
                at.body,
                prefill_host=p.host,
                bootstrap_port=p.bootstrap_port,
                pair_id=at.root,
                attempt=at.number,
                request_id=at.rid,
            )
        except BootstrapError as exc:
            raise Retry(str(exc), 503, ep=p) from None
        loop = asyncio.get_running_loop()
        ptask = loop.create_task(at.prefill_leg(p, orjson.dumps(pbody)))
        dtask = loop.create_task(at.serve(d, orjson.dumps(dbody)))
        try:
            done, _ = await asyncio.wait({ptask, dtask}, return_when=asyncio.FIRST_COMPLETED)
            if ptask in done and not at.committed and _failed(ptask):
                # Decode would wait for KV that never comes: stop it and try another candidate.
                dtask.cancel()
                at.abort(d)
                await asyncio.gather(dtask, return_exceptions=True)
                raise _as_retry(ptask, p)
            try:
                await dtask
            except (Retry, Broken):
                if not ptask.done():
                    ptask.cancel()
                    at.abort(p)
                raise
            finally:
                at.keep(ptask)
        except asyncio.CancelledError:
            # The client went away: stop both engines.
            for t in (ptask, dtask):
                t.cancel()
                at.keep(t)
            at.abort(p)
            at.abort(d)
            raise


def _failed(task: asyncio.Task[Any]) -> bool:
    return task.cancelled() or task.exception() is not None


def _as_retry(task: asyncio.Task[Any], p: Endpoint) -> Retry:
    exc = None if task.cancelled() else task.exception()
    return exc if isinstance(exc, Retry) else Retry(f"prefill failed: {exc!r}", ep=p)
