"""round_robin: each endpoint in turn, skipping excluded ones."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from coordinator.policies.base import RequestInfo, allowed
from coordinator.table import Endpoint


class RoundRobin:
    """Rotate over the candidates; blind to load."""

    name = "round_robin"
    uses_prefix = False

    def __init__(self) -> None:
        self._next = 0

    def select(
        self, endpoints: Sequence[Endpoint], req: RequestInfo, exclude: Collection[str] = ()
    ) -> Endpoint | None:
        """The next endpoint in rotation."""
        eps = allowed(endpoints, exclude)
        if not eps:
            return None
        i = self._next % len(eps)
        self._next = i + 1
        return eps[i]
