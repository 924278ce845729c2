"""What can serve a model, from its routable endpoints: the kinds of path a request may take.

P/D when prefill and decode share a protocol (fail closed otherwise: same engine type and a
common capability), union when union endpoints are up, a prefill alone as the last resort.
The router weighs the actual endpoints per request; this only says which kinds exist.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from coordinator.endpoint import Endpoint, Plan
from core.events import Role

# Preferred P/D protocol per engine type when a pair shares several.
_CAPABILITY_PREFERENCE: dict[str, tuple[str, ...]] = {
    "vllm": ("handoff", "trigger"),
    "sglang": ("bootstrap",),
    "builtin": ("handoff", "bootstrap"),
}


def make_plan(eps: Sequence[Endpoint], model: str | None, why_none: Callable[[], str]) -> Plan:
    """The plan for `model` over its routable endpoints `eps`; `why_none` explains an empty one."""
    prefill = [e for e in eps if e.role == Role.PREFILL]
    decode = [e for e in eps if e.role == Role.DECODE]
    union = [e for e in eps if e.role == Role.UNION]
    shared = tuple(shared_protocols(prefill, decode)) if prefill and decode else ()
    if shared:
        engine_type, capability = shared[0]
        return Plan(
            kind="pd",
            capability=capability,
            engine_type=engine_type,
            pd=shared,
            union=bool(union),
            prefill=True,
        )
    if union:
        return Plan(kind="single", role=Role.UNION, union=True, prefill=bool(prefill))
    if prefill and decode:
        return Plan(
            kind="none",
            reason="no compatible prefill/decode pair: "
            f"prefill speaks {_protocols(prefill)}, decode speaks {_protocols(decode)}",
        )
    if prefill:
        return Plan(kind="single", role=Role.PREFILL, prefill=True)
    if decode:
        what = f"model {model!r}" if model is not None else "any model"
        return Plan(kind="none", reason=f"only decode instances are routable for {what}")
    return Plan(kind="none", reason=why_none())


def _protocols(eps: list[Endpoint]) -> str:
    pairs = sorted({f"{e.engine_type}:{c}" for e in eps for c in e.capabilities} or {"nothing"})
    return ",".join(pairs)


def shared_protocols(prefill: list[Endpoint], decode: list[Endpoint]) -> list[tuple[str, str]]:
    """(engine_type, capability) pairs both sides speak, preferred first (fail closed: same engine)."""
    p = {(e.engine_type, c) for e in prefill for c in e.capabilities}
    d = {(e.engine_type, c) for e in decode for c in e.capabilities}
    shared = p & d

    def rank(pair: tuple[str, str]) -> tuple[int, str, str]:
        pref = _CAPABILITY_PREFERENCE.get(pair[0], ())
        return (pref.index(pair[1]) if pair[1] in pref else len(pref), pair[0], pair[1])

    return sorted(shared, key=rank)
