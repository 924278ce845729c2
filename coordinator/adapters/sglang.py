"""SGLang's P/D bootstrap: the same request to prefill and decode at once, met in a room.

Both legs get `bootstrap_host` (the prefill host), `bootstrap_port` (the prefill endpoint's
registered bootstrap port) and `bootstrap_room` (a stable 63-bit hash of the pair id and the
attempt), so the decode engine pulls the KV the prefill engine computes. The client sees the
decode response; if either leg fails the other is aborted with `POST /abort_request`.
"""

from __future__ import annotations

from typing import Any

from core.ids import room_id

CAPABILITY = "bootstrap"
ABORT_PATH = b"/abort_request"


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


def abort_body(request_id: str) -> dict[str, Any]:
    """The body of `POST /abort_request` for one engine request."""
    return {"rid": request_id}
