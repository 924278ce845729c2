"""core.histogram: inclusive bounds, weighted observations, Prometheus-ordered cumulative buckets."""

from __future__ import annotations

import pytest

from core.histogram import Histogram


@pytest.mark.parametrize(
    ("values", "want"),
    [
        ((), [("1.0", 0.0), ("2.5", 0.0), ("+Inf", 0.0)]),
        ((1,), [("1.0", 1.0), ("2.5", 1.0), ("+Inf", 1.0)]),  # on a bound: that bucket
        ((1.01, 2.5), [("1.0", 0.0), ("2.5", 2.0), ("+Inf", 2.0)]),
        ((0.0, 3.0, 99.0), [("1.0", 1.0), ("2.5", 1.0), ("+Inf", 3.0)]),
    ],
)
def test_cumulative(values: tuple[float, ...], want: list[tuple[str, float]]) -> None:
    h = Histogram((1, 2.5))
    for v in values:
        h.observe(v)
    assert h.cumulative() == want
    assert h.total == pytest.approx(sum(values))


def test_weighted_observation() -> None:
    h = Histogram((0.1,))
    h.observe(0.05, n=4)
    assert h.cumulative() == [("0.1", 4.0), ("+Inf", 4.0)]
    assert h.total == pytest.approx(0.2)
