"""Endpoint, Incarnation, Plan and Candidate: what the routing table hands the hot path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from core.events import Role


@dataclass(slots=True, eq=False)
class Endpoint:
    """One routable engine HTTP endpoint and its load."""

    key: str  # stable: "<node_id>/<endpoint_id>", "ext/<id>" or "ext/<id>/<endpoint_id>"
    instance_id: int
    role: Role
    engine_type: str
    model: str
    host: str
    port: int
    bootstrap_port: int | None
    capabilities: frozenset[str]
    group: int | None  # P/D group for precision isolation (the d instance id)
    running: int = 0
    waiting: int = 0
    avail_slots: int = 0
    avail_blocks: int = 0
    adapters: frozenset[str] = frozenset()  # LoRA adapters loaded on it: requests may name them
    inflight: int = 0  # this coordinator's requests on it now: counted only by `busy`
    ttft: float = 0.0  # its recent time to first byte, seconds (0: none yet; `proxy.hedge`)
    # `with ep.busy:` counts a request on it for the block: the one way it is counted.
    busy: InFlight = field(init=False, repr=False, compare=False)

    def serves(self, model: str | None) -> bool:
        """Whether a request naming `model` (any when None) may go here: its model or an adapter."""
        return model is None or self.model == model or model in self.adapters

    @property
    def load(self) -> int:
        """Queue depth used by the load-aware policies."""
        return self.running + self.waiting + self.inflight

    def __post_init__(self) -> None:
        self.busy = InFlight(self)

    def as_dict(self) -> dict[str, Any]:
        """JSON view for `GET /v1/instances`."""
        return {
            "key": self.key,
            "instance_id": self.instance_id,
            "role": self.role.value,
            "engine_type": self.engine_type,
            "model": self.model,
            "host": self.host,
            "port": self.port,
            "bootstrap_port": self.bootstrap_port,
            "capabilities": sorted(self.capabilities),
            "group": self.group,
            "running": self.running,
            "waiting": self.waiting,
            "avail_slots": self.avail_slots,
            "avail_blocks": self.avail_blocks,
            "inflight": self.inflight,
            "adapters": sorted(self.adapters),
        }


class InFlight:
    """An endpoint's in-flight count as a context manager (one per endpoint, made with it, so
    counting costs a request no object).

    The attempt loop holds it on the endpoint whose answer the client gets (a P/D decode from
    the moment the pair is chosen, prefill leg included, so a burst sees the pair busy at once)
    and the prefill leg on its prefill. (The exchanges on an endpoint, which end when it
    leaves routing, are `proxy.exchanges`'.)"""

    __slots__ = ("ep",)

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep

    def __enter__(self) -> Endpoint:
        self.ep.inflight += 1
        return self.ep

    def __exit__(self, *exc: object) -> None:
        self.ep.inflight -= 1


@dataclass(frozen=True, slots=True)
class Incarnation:
    """One engine process behind an endpoint: its pid (when the agent says) and its READY's sequence."""

    pid: int | None
    ready_seq: int

    def describe(self) -> str:
        """How an operator recognises it: the pid, else the READY event's sequence."""
        return f"pid {self.pid}" if self.pid is not None else f"READY at seq {self.ready_seq}"


@dataclass(frozen=True, slots=True)
class Plan:
    """What can serve a model on one client route, from the routable endpoints (before the
    breaker): the kinds of candidate there are (`coordinator.plan.make_plan`).

    `kind`, `role`, `capability` and `engine_type` name the first choice when everything is
    healthy (P/D, else a single hop) for `GET /v1/instances`; the chooser uses `pd`, `union`,
    `prefill`, `decode` and `engines` to know which candidates to weigh per attempt. `none`
    means nothing can serve (refused before any attempt), with `reason`.
    """

    kind: Literal["pd", "single", "none"]
    role: Role | None = None  # single: union or prefill
    capability: str | None = None  # pd: the shared P/D protocol (handoff | bootstrap | ...)
    engine_type: str | None = None  # pd: both sides speak this engine's protocol
    reason: str = ""  # none: why nothing can serve
    pd: tuple[tuple[str, str], ...] = ()  # (engine_type, capability) P and D share, preferred first
    union: bool = False  # union endpoints are routable
    prefill: bool = False  # prefill endpoints may serve alone ...
    prefill_last: bool = True  # ... only once no decode is usable (a route a pair can split)
    decode: bool = False  # decode endpoints may serve alone (routes every role answers)
    engines: frozenset[str] | None = None  # the engine types that serve the route (None: all)

    @property
    def paths(self) -> list[str]:
        """The kinds of path this model has, in fallback order (for `GET /v1/instances`)."""
        out = [f"pd:{et}/{cap}" for et, cap in self.pd]
        if self.union:
            out.append("union")
        if self.prefill:
            out.append("prefill")
        if self.decode:
            out.append("decode")
        return out


class Candidate:
    """One way to serve an attempt: a single hop to `ep`, or a prefill leg then `ep` (decode)."""

    __slots__ = ("capability", "ep", "prefill")

    def __init__(self, ep: Endpoint, prefill: Endpoint | None = None, capability: str | None = None) -> None:
        self.ep = ep  # the endpoint whose response the client gets
        self.prefill = prefill  # P/D: the prefill leg
        self.capability = capability  # P/D: the protocol both legs speak

    def __repr__(self) -> str:
        if self.prefill is None:
            return f"Candidate({self.ep.key})"
        return f"Candidate({self.prefill.key} -> {self.ep.key} via {self.capability})"
