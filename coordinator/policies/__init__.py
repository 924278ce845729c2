"""Scheduling policies: one file each behind one interface, and the registry of their names."""

from __future__ import annotations

from collections.abc import Callable

from coordinator.policies.base import Policy, RequestInfo, allowed, prompt_prefix
from coordinator.policies.kv_aware import KvAware
from coordinator.policies.least_load import LeastLoad
from coordinator.policies.power_of_two import PowerOfTwo
from coordinator.policies.prefix_affinity import PrefixAffinity
from coordinator.policies.round_robin import RoundRobin
from core.kvblocks import KvView

# Each factory is given the coordinator's folded KV view (only kv_aware reads it).
REGISTRY: dict[str, Callable[[KvView], Policy]] = {
    "round_robin": lambda _: RoundRobin(),
    "least_load": lambda _: LeastLoad(),
    "power_of_two": lambda _: PowerOfTwo(),
    "prefix_affinity": lambda _: PrefixAffinity(),
    "kv_aware": KvAware,
}


def make_policy(name: str, kv: KvView | None = None) -> Policy:
    """A fresh policy by its registry name, over `kv` (default: an empty view); ValueError
    naming the known ones otherwise."""
    factory = REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown scheduling policy {name!r} (known: {', '.join(sorted(REGISTRY))})")
    return factory(kv if kv is not None else KvView())


__all__ = [
    "REGISTRY",
    "KvAware",
    "LeastLoad",
    "Policy",
    "PowerOfTwo",
    "PrefixAffinity",
    "RequestInfo",
    "RoundRobin",
    "allowed",
    "make_policy",
    "prompt_prefix",
]
