"""Endpoint and Plan: what the routing table hands the hot path."""

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
class Plan:
    """Motor's router choice for one model: P/D two hops, a single hop, or none (503)."""

    kind: Literal["pd", "single", "none"]
    role: Role | None = None  # single: union or prefill
    capability: str | None = None  # pd: the shared P/D protocol (handoff | bootstrap | ...)
    engine_type: str | None = None  # pd: both sides speak this engine's protocol
    reason: str = ""  # none: why nothing can serve
