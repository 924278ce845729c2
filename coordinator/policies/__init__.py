"""Scheduling policies: one file each behind one interface, and the registry of their names."""

from __future__ import annotations

from collections.abc import Callable

from coordinator.policies.base import Policy, RequestInfo, allowed, prompt_prefix
from coordinator.policies.least_load import LeastLoad
from coordinator.policies.power_of_two import PowerOfTwo
from coordinator.policies.prefix_affinity import PrefixAffinity
from coordinator.policies.round_robin import RoundRobin

REGISTRY: dict[str, Callable[[], Policy]] = {
    "round_robin": RoundRobin,
    "least_load": LeastLoad,
    "power_of_two": PowerOfTwo,
    "prefix_affinity": PrefixAffinity,
}


def make_policy(name: str) -> Policy:
    """A fresh policy by its registry name; ValueError naming the known ones otherwise."""
    factory = REGISTRY.get(name)
    if factory is None:
        raise ValueError(f"unknown scheduling policy {name!r} (known: {', '.join(sorted(REGISTRY))})")
    return factory()


__all__ = [
    "REGISTRY",
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
