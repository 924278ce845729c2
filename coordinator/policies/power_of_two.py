"""power_of_two: two random candidates, the less loaded one wins."""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence

from coordinator.policies.base import RequestInfo, allowed
from coordinator.table import Endpoint


class PowerOfTwo:
    """Near least-load quality at O(1), and no herd on one endpoint between load updates."""

    name = "power_of_two"
    uses_prefix = False

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()

    def select(
        self, endpoints: Sequence[Endpoint], req: RequestInfo, exclude: Collection[str] = ()
    ) -> Endpoint | None:
        """The less loaded of two random endpoints."""
        eps = allowed(endpoints, exclude)
        n = len(eps)
        if n == 0:
            return None
        if n == 1:
            return eps[0]
        i = self._rng.randrange(n)
        j = self._rng.randrange(n - 1)
        if j >= i:
            j += 1
        a, b = eps[i], eps[j]
        return b if b.load < a.load else a
