"""A bucketed histogram as plain numbers, for hot paths that cannot afford a lock per sample.

Components turn it into a Prometheus family at scrape time (`cumulative()` gives the `le`
buckets in Prometheus order). Bounds are inclusive upper bounds, as Prometheus defines them.
"""

from __future__ import annotations

from bisect import bisect_left


class Histogram:
    """Counts per bucket (the last one is +Inf), and the sum of what was observed."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        """Record `n` observations of `value`."""
        self.counts[bisect_left(self.bounds, value)] += n  # value <= bound lands in that bucket
        self.total += value * n

    def cumulative(self) -> list[tuple[str, float]]:
        """`(le, count of observations <= le)` per bound, then `("+Inf", all)`."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*(repr(float(b)) for b in self.bounds), "+Inf"), self.counts, strict=True):
            running += n
            out.append((bound, float(running)))
        return out
