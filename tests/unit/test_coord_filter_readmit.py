"""A request's exclusions belong to the engine process that failed it (`attempts.Filter.readmit`)."""

from __future__ import annotations

import pytest

from coordinator.proxy.attempts import Filter
from coordinator.table import Incarnation

OLD, NEW = Incarnation(100, 7), Incarnation(200, 19)


@pytest.mark.parametrize(
    ("failed_as", "now", "readmitted"),
    [
        (OLD, OLD, False),  # the same process: stays excluded
        (OLD, NEW, True),  # READY again as another process: a candidate again
        (OLD, Incarnation(100, 25), True),  # same pid, a later READY: another process by the table
        (None, None, False),  # never READY in this table (an external endpoint): stays excluded
        (None, NEW, True),  # failed before its first READY, READY since
        (OLD, None, True),  # forgotten by the table (log lost): not the process that failed
    ],
)
def test_readmit_by_incarnation(
    failed_as: Incarnation | None, now: Incarnation | None, readmitted: bool
) -> None:
    filt = Filter()
    filt.exclude("n1/0")
    filt.exclude("n2/0")
    table = {"n1/0": failed_as, "n2/0": OLD}
    assert filt.readmit(table.__getitem__) == []  # the processes that failed, noted
    table["n1/0"] = now
    back = filt.readmit(table.__getitem__)
    assert back == (["n1/0"] if readmitted else [])
    assert ("n1/0" in filt.excluded) is not readmitted
    assert "n2/0" in filt.excluded
    assert filt.readmit(table.__getitem__) == []  # said once


def test_readmit_without_exclusions_asks_nothing() -> None:
    def never(key: str) -> Incarnation | None:
        raise AssertionError("asked the table although nothing was excluded")

    assert Filter().readmit(never) == []
