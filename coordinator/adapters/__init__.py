"""P/D adapters: one protocol a file behind one interface, and the registry of the capabilities
engines register (`handoff`: vLLM's KV handoff, `bootstrap`: SGLang's bootstrap rooms)."""

from __future__ import annotations

from coordinator.adapters.base import PDAdapter
from coordinator.adapters.bootstrap import Bootstrap
from coordinator.adapters.handoff import Handoff

REGISTRY: dict[str, PDAdapter] = {a.capability: a for a in (Handoff(), Bootstrap())}


def adapter_for(capability: str | None) -> PDAdapter | None:
    """The adapter of a P/D capability, None when the coordinator speaks no such protocol."""
    return REGISTRY.get(capability) if capability is not None else None


def splitting(path: bytes) -> tuple[str, ...]:
    """The capabilities whose adapters can run `path` (a seed 003 route) over a P/D pair."""
    return tuple(sorted(c for c, a in REGISTRY.items() if path in a.native_paths))


__all__ = ["REGISTRY", "Bootstrap", "Handoff", "PDAdapter", "adapter_for", "splitting"]
