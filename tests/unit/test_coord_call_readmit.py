"""A request's exclusions belong to the engine process that failed it (`Call.readmit`)."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.proxy.call import Call
from coordinator.table import Incarnation

OLD, NEW = Incarnation(100, 7), Incarnation(200, 19)


def _call() -> Call:
    conn: Any = None  # readmit never touches the connection or the request
    req: Any = None
    return Call(conn, req, "test", b"/v1/completions", {"model": "m"}, b"{}", "root")


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
    call = _call()
    call.exclude.update({"n1/0", "n2/0"})
    table = {"n1/0": failed_as, "n2/0": OLD}
    assert call.readmit(table.__getitem__) == []  # the processes that failed, noted
    table["n1/0"] = now
    back = call.readmit(table.__getitem__)
    assert back == (["n1/0"] if readmitted else [])
    assert ("n1/0" in call.exclude) is not readmitted
    assert "n2/0" in call.exclude
    assert call.readmit(table.__getitem__) == []  # said once


def test_readmit_without_exclusions_asks_nothing() -> None:
    def never(key: str) -> Incarnation | None:
        raise AssertionError("asked the table although nothing was excluded")

    assert _call().readmit(never) == []
