"""Comparing an OpenAI-shaped body the coordinator built with the one an engine answers."""

from __future__ import annotations

from collections.abc import Set
from typing import Any


def same_information(via: Any, own: Any, skip: Set[str] = frozenset()) -> bool:
    """`via` holds every non-empty value of `own` (recursively) and no key `own` lacks.

    A whole answer folded from a stream cannot know the fields an engine sets only on a whole
    answer, and only ever null or empty there (vLLM 0.32's `metrics`, `service_tier`, older
    vLLM's `tool_calls: []` …): those may be missing. `skip`: top-level keys not compared (`id`, `created`).
    """
    if isinstance(own, dict) and isinstance(via, dict):
        if set(via) - set(own):
            return False
        return all(
            k in skip or (_empty(v) and _empty(via.get(k))) or (k in via and same_information(via[k], v))
            for k, v in own.items()
        )
    if isinstance(own, list) and isinstance(via, list):
        return len(via) == len(own) and all(same_information(a, b) for a, b in zip(via, own, strict=True))
    return bool(via == own)


def _empty(v: Any) -> bool:
    return v is None or v == [] or v == {}
