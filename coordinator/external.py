"""Endpoints of engines registered from outside (`POST /v1/instances/refresh`, seed 001).

The refresh body was validated on the way in (`coordinator.refresh`); here an entry of the
folded state becomes the endpoints the table routes: one at the instance's `ip:port`, or one
per entry of its optional `endpoints` list (Motor's newer form, with `business_port` and a
`bootstrap_port` for SGLang).
"""

from __future__ import annotations

from typing import Any

from coordinator.endpoint import Endpoint
from core.bounds import MAX_COUNT, UINT32_MAX, UINT64_MAX
from core.events import Role

# Seed 001's role codes (static_info.role); 85 (undefined) serves both phases: a union.
ROLE_CODES = {80: Role.PREFILL, 68: Role.DECODE, 85: Role.UNION}

# What an externally registered engine speaks for P/D when the refresh body does not say.
DEFAULT_CAPABILITIES: dict[str, tuple[str, ...]] = {
    "vllm": ("handoff",),
    "sglang": ("bootstrap",),
    "builtin": ("handoff", "bootstrap"),
}


def external_endpoints(ext_id: int, raw: dict[str, Any]) -> list[Endpoint]:
    """The endpoints of one externally registered instance; ValueError/TypeError if malformed."""
    static = raw.get("static_info") or {}
    dynamic = raw.get("dynamic_info") or {}
    role = ROLE_CODES.get(_int(static.get("role", 85), "static_info.role"), Role.UNION)
    engine_type = str(raw.get("engine_type") or "vllm")
    caps = raw.get("capabilities")
    capabilities = (
        frozenset(caps) if caps is not None else frozenset(DEFAULT_CAPABILITIES.get(engine_type, ()))
    )
    total_slots = _int(static.get("total_slots_num", 0), "static_info.total_slots_num", hi=MAX_COUNT)
    avail_slots = _int(
        dynamic.get("avail_slots_num", total_slots), "dynamic_info.avail_slots_num", hi=MAX_COUNT
    )
    avail_blocks = _int(dynamic.get("avail_block_num", 0), "dynamic_info.avail_block_num", hi=MAX_COUNT)
    group = static.get("group_id")
    model = str(raw.get("model_name", ""))

    def make(key: str, host: Any, port: Any, bootstrap: Any) -> Endpoint:
        return Endpoint(
            key=key,
            instance_id=ext_id,
            role=role,
            engine_type=engine_type,
            model=model,
            host=str(host),
            port=_int(port, "port", 1, 65535),
            bootstrap_port=_int(bootstrap, "bootstrap_port", 1, 65535) if bootstrap is not None else None,
            capabilities=capabilities,
            group=_int(group, "static_info.group_id") if group is not None else None,
            running=max(0, total_slots - avail_slots),
            avail_slots=avail_slots,
            avail_blocks=avail_blocks,
        )

    eps = raw.get("endpoints")
    if eps:
        return [
            make(
                f"ext/{ext_id}/{_int(e['id'], 'endpoints.id', hi=UINT32_MAX)}",
                e.get("ip") or raw.get("ip"),
                e["business_port"],
                e.get("bootstrap_port", raw.get("bootstrap_port")),
            )
            for e in eps
        ]
    return [make(f"ext/{ext_id}", raw.get("ip", ""), raw.get("port", 0), raw.get("bootstrap_port"))]


def _int(value: Any, field: str, lo: int = 0, hi: int = UINT64_MAX) -> int:
    """An integer, or a string of ASCII digits (seed 001 writes ports so), within [lo, hi].

    The refresh API wrote it so (`coordinator.refresh`), but anyone with publish rights may
    have written the entry: a port of 70000 or -1 must not reach routing.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)
    else:
        raise ValueError(f"{field} is not an integer: {value!r}")
    if not lo <= number <= hi:
        raise ValueError(f"{field} {number} is outside [{lo}, {hi}]")
    return number
