"""What can serve a model on one client route, from its routable endpoints: the kinds of
candidate a request may take, and why each other endpoint is none.

P/D when prefill and decode share a protocol the route can be split by (fail closed
otherwise: same engine type and a common capability), union when union endpoints are up, a
prefill (or, where the route allows it, a decode) alone as the last resort. Which endpoints a
route admits at all is its `Serves`: the `/v1` generation routes take every engine, role and
protocol; an engine-native route (`/generate`, `/tokenize` …) only the engine types that
serve it. The chooser (`choose.py`) weighs the actual endpoints per attempt; this only says
which kinds exist.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from coordinator.endpoint import Endpoint, Plan
from core.events import Role

# Preferred P/D protocol per engine type when a pair shares several.
_CAPABILITY_PREFERENCE: dict[str, tuple[str, ...]] = {
    "vllm": ("handoff", "trigger"),
    "sglang": ("bootstrap",),
    "builtin": ("handoff", "bootstrap"),
}


@dataclass(frozen=True, eq=False, slots=True)
class Serves:
    """Which endpoints may answer one client route, and how.

    Compared by identity (one object a route), so it is a cheap cache key."""

    engines: frozenset[str] | None = None  # engine types that serve the route; None: every one
    alone: tuple[Role, ...] = (Role.UNION, Role.PREFILL)  # roles answering it alone, preferred first
    pd: tuple[str, ...] | None = None  # P/D protocols whose adapters split it; None: every one

    @property
    def splits(self) -> bool:
        """Whether a prefill → decode pair may serve the route (a lone prefill is then a stand-in)."""
        return self.pd is None or bool(self.pd)


GENERATION = Serves()  # the /v1 generation routes: any engine, union or P/D, a prefill as a stand-in


def make_plan(
    eps: Sequence[Endpoint], model: str | None, why_none: Callable[[], str], serves: Serves = GENERATION
) -> Plan:
    """The plan for `model` on a route `serves` describes, over its routable endpoints `eps`;
    `why_none` explains an empty one."""
    if serves.engines is not None:
        eps = [e for e in eps if e.engine_type in serves.engines]
    prefill = [e for e in eps if e.role == Role.PREFILL]
    decode = [e for e in eps if e.role == Role.DECODE]
    union = [e for e in eps if e.role == Role.UNION] if Role.UNION in serves.alone else []
    shared: tuple[tuple[str, str], ...] = ()
    if prefill and decode and serves.splits:
        shared = tuple(p for p in shared_protocols(prefill, decode) if serves.pd is None or p[1] in serves.pd)
    alone_prefill = bool(prefill) and Role.PREFILL in serves.alone
    alone_decode = bool(decode) and Role.DECODE in serves.alone
    kinds: dict[str, Any] = {
        "union": bool(union),
        "prefill": alone_prefill,
        "prefill_last": serves.splits,
        "decode": alone_decode,
        "engines": serves.engines,
    }
    if shared:
        engine_type, capability = shared[0]
        return Plan(kind="pd", capability=capability, engine_type=engine_type, pd=shared, **kinds)
    if union:
        return Plan(kind="single", role=Role.UNION, **kinds)
    if prefill and decode and serves.splits:
        return Plan(
            kind="none",
            reason="no compatible prefill/decode pair: "
            f"prefill speaks {_protocols(prefill)}, decode speaks {_protocols(decode)}",
        )
    for role, usable in ((Role.PREFILL, alone_prefill), (Role.DECODE, alone_decode)):
        if usable:
            return Plan(kind="single", role=role, **kinds)
    if decode:
        what = f"model {model!r}" if model is not None else "any model"
        return Plan(kind="none", reason=f"only decode instances are routable for {what}")
    return Plan(kind="none", reason=why_none())


def why_not(
    rows: Iterable[dict[str, Any]], model: str | None, serves: Serves, failed: Collection[str]
) -> list[str]:
    """Why each known endpoint of `model` (rows of `RoutingTable.describe`) is no candidate for a
    request that `failed` on some of them: what a request's decision record would say."""
    why = []
    for row in rows:
        if model is not None and row["model"] != model:
            continue
        key = row["key"]
        if key in failed:
            why.append(f"{key} failed for this request")
        elif not row["routable"]:
            why.append(f"{key} {row['reason']}")
        elif serves.engines is not None and row["engine_type"] not in serves.engines:
            why.append(f"{key} is a {row['engine_type']} engine")
    return why


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
