"""Endpoint, Incarnation and Plan: what the routing table hands the hot path."""

from __future__ import annotations

from dataclasses import dataclass
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
    inflight: int = 0  # this coordinator's in-flight requests (the proxy increments/decrements)

    @property
    def load(self) -> int:
        """Queue depth used by the load-aware policies."""
        return self.running + self.waiting + self.inflight

    @property
    def base_url(self) -> str:
        """`http://host:port` of the engine's business port."""
        return f"http://{self.host}:{self.port}"

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
        }


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
    """What can serve a model, from the routable endpoints (before the breaker).

    `kind`, `role`, `capability` and `engine_type` name the first choice when everything is
    healthy (P/D, else a single hop) for `GET /v1/instances`; the router uses `pd`, `union`
    and `prefill` to know which paths to weigh per request. `none` means nothing can serve
    (a 503 before any attempt), with `reason`.
    """

    kind: Literal["pd", "single", "none"]
    role: Role | None = None  # single: union or prefill
    capability: str | None = None  # pd: the shared P/D protocol (handoff | bootstrap | ...)
    engine_type: str | None = None  # pd: both sides speak this engine's protocol
    reason: str = ""  # none: why nothing can serve
    pd: tuple[tuple[str, str], ...] = ()  # (engine_type, capability) P and D share, preferred first
    union: bool = False  # union endpoints are routable
    prefill: bool = False  # prefill endpoints may serve alone when no decode is usable

    @property
    def paths(self) -> list[str]:
        """The kinds of path this model has, in fallback order (for `GET /v1/instances`)."""
        out = [f"pd:{et}/{cap}" for et, cap in self.pd]
        if self.union:
            out.append("union")
        if self.prefill:
            out.append("prefill")
        return out


class Route:
    """One path chosen for one attempt: a single hop to `ep`, or a prefill leg then `ep` (decode)."""

    __slots__ = ("capability", "ep", "prefill")

    def __init__(self, ep: Endpoint, prefill: Endpoint | None = None, capability: str | None = None) -> None:
        self.ep = ep  # the endpoint whose response the client gets
        self.prefill = prefill  # P/D: the prefill leg
        self.capability = capability  # P/D: the protocol both legs speak

    def __repr__(self) -> str:
        if self.prefill is None:
            return f"Route({self.ep.key})"
        return f"Route({self.prefill.key} -> {self.ep.key} via {self.capability})"
