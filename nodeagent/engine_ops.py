"""A fleet operation on this node's engines: each engine kind's native route for each op.

The table (`ROUTES`) is the whole mapping; an op an engine kind lacks is reported
`unsupported`, never tried, and so is a route the engine answers 404 or 405 (a vLLM without
`VLLM_SERVER_DEV_MODE=1` or older than the route). Bodies and routes as in the engines' own
servers (checked against vLLM 0.32's `vllm/entrypoints/serve/`): vLLM's dev-mode routes
`/sleep?level=`, `/wake_up`, `/reset_prefix_cache`, `/collective_rpc`; `/pause?mode=keep` and
`/resume` of its RL router; LoRA with `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`; SGLang's
`python/sglang/srt/entrypoints/http_server.py`.
The builtin engine answers both spellings (`simengine.admin_api`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from core.events import EngineOpResult, FleetOpArgs

# call(method, url, json body or None, timeout) -> (HTTP status, body text); raises OSError or
# TimeoutError when the engine does not answer.
Call = Callable[[str, str, dict[str, Any] | None, float], Awaitable[tuple[int, str]]]

UNSUPPORTED_STATUS = frozenset({404, 405, 501})
DETAIL_MAX = 300


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    path: str  # may name `{level}`
    body: Callable[[FleetOpArgs], dict[str, Any] | None] = lambda a: None

    def url_path(self, args: FleetOpArgs) -> str:
        return self.path.format(level=args.level)


def _lora(a: FleetOpArgs) -> dict[str, Any]:
    return {"lora_name": a.lora_name, "lora_path": a.path}


def _lora_name(a: FleetOpArgs) -> dict[str, Any]:
    return {"lora_name": a.lora_name}


_VLLM: dict[str, Route] = {
    "flush-cache": Route("POST", "/reset_prefix_cache"),
    # "keep": requests under way freeze and go on at /resume (the default, "abort", cuts them).
    "pause": Route("POST", "/pause?mode=keep"),
    "continue": Route("POST", "/resume"),
    "reload-weights": Route("POST", "/collective_rpc", lambda a: {"method": "reload_weights"}),
    "sleep": Route("POST", "/sleep?level={level}"),
    "wake": Route("POST", "/wake_up"),
    "lora-load": Route("POST", "/v1/load_lora_adapter", _lora),
    "lora-unload": Route("POST", "/v1/unload_lora_adapter", _lora_name),
}
_SGLANG: dict[str, Route] = {
    "flush-cache": Route("POST", "/flush_cache"),
    "pause": Route("POST", "/pause_generation", lambda a: {"mode": "in_place"}),
    "continue": Route("POST", "/continue_generation", lambda a: {}),
    "reload-weights": Route("POST", "/update_weights_from_disk", lambda a: {"model_path": a.path}),
    "sleep": Route("POST", "/release_memory_occupation", lambda a: {}),
    "wake": Route("POST", "/resume_memory_occupation", lambda a: {}),
    "lora-load": Route("POST", "/load_lora_adapter", _lora),
    "lora-unload": Route("POST", "/unload_lora_adapter", _lora_name),
}
# The builtin engine answers both spellings (`simengine.admin_api`) but for vLLM's `/resume`,
# its container snapshot's route: pause and continue are SGLang's there.
_BUILTIN: dict[str, Route] = {
    **_VLLM,
    "pause": _SGLANG["pause"],
    "continue": _SGLANG["continue"],
    "reload-weights": _SGLANG["reload-weights"],
}
ROUTES: dict[str, dict[str, Route]] = {"vllm": _VLLM, "sglang": _SGLANG, "builtin": _BUILTIN}


def route_for(engine_type: str, op: str) -> Route | None:
    """The route of `op` on an engine of `engine_type`; None when it has none."""
    return ROUTES.get(engine_type, {}).get(op)


def needs(op: str, args: FleetOpArgs) -> str | None:
    """What the op lacks to be run at all (a CLI or a hand-written event may omit it)."""
    if op in ("lora-load", "lora-unload") and not args.lora_name:
        return f"{op} needs lora_name"
    if op == "lora-load" and not args.path:
        return "lora-load needs path (the adapter's directory)"
    return None


async def run_one(
    call: Call, engine_type: str, base_url: str, endpoint_id: int, op: str, args: FleetOpArgs, within: float
) -> EngineOpResult:
    """Run `op` on one engine and say how it went; never raises."""
    route = route_for(engine_type, op)
    if route is None:
        return EngineOpResult(
            endpoint_id=endpoint_id, outcome="unsupported", detail=f"{engine_type} has no {op}"
        )
    missing = needs(op, args)
    if missing is not None:
        return EngineOpResult(endpoint_id=endpoint_id, outcome="failed", detail=missing)
    path = route.url_path(args)
    try:
        status, text = await call(route.method, base_url + path, route.body(args), within)
    except (OSError, TimeoutError) as exc:
        why = f"{route.method} {path}: no answer ({type(exc).__name__}: {exc})"
        return EngineOpResult(endpoint_id=endpoint_id, outcome="failed", detail=why[:DETAIL_MAX])
    said = f"{route.method} {path} -> {status} {text.strip()}"[:DETAIL_MAX]
    if status in UNSUPPORTED_STATUS:
        return EngineOpResult(endpoint_id=endpoint_id, outcome="unsupported", status=status, detail=said)
    ok = 200 <= status < 300 and not _said_no(text)
    return EngineOpResult(
        endpoint_id=endpoint_id, outcome="ok" if ok else "failed", status=status, detail=said
    )


def _said_no(text: str) -> bool:
    """A 200 whose JSON body says `"success": false` (vLLM's prefix-cache reset while blocks are
    held, SGLang's weight update that did not take)."""
    try:
        body = json.loads(text)
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("success") is False
