"""least_load: the endpoint with the fewest running + waiting + in-flight requests."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from coordinator.policies.base import RequestInfo
from coordinator.table import Endpoint


class LeastLoad:
    """Lowest load wins; ties rotate so equal endpoints share a burst."""

    name = "least_load"
    uses_prefix = False

    def __init__(self) -> None:
        self._start = 0

    def select(
        self, endpoints: Sequence[Endpoint], req: RequestInfo, exclude: Collection[str] = ()
    ) -> Endpoint | None:
        """The least loaded endpoint not excluded."""
        n = len(endpoints)
        if n == 0:
            return None
        start = self._start % n
        self._start = start + 1
        best: Endpoint | None = None
        best_load = 0
        for i in range(n):
            e = endpoints[(start + i) % n]
            if exclude and e.key in exclude:
                continue
            load = e.running + e.waiting + e.inflight
            if best is None or load < best_load:
                best, best_load = e, load
        return best
