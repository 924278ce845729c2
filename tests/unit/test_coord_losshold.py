"""Across a lost log the table keeps routing what the new log is re-adopting (coordinator.losshold)."""

from __future__ import annotations

import pytest

from coordinator.table import RoutingTable
from core.events import EndpointStatus, EventBase, InstanceState, Role
from tests.unit.coord_events import alarm, endpoint_status, instance_events, instance_state

READY, DEAD = EndpointStatus.READY, EndpointStatus.DEAD


def serving() -> RoutingTable:
    """A union instance 3 ACTIVE, its engine READY as pid 100."""
    t = RoutingTable()
    for seq, ev in enumerate(instance_events(3, Role.UNION, status=None), 1):
        t.apply(ev, seq)
    t.apply(endpoint_status("n3", 0, READY, 3, pid=100), 10)
    assert [e.key for e in t.candidates(Role.UNION, "motor-sim")] == ["n3/0"]
    return t


def readopted(then: list[EventBase]) -> list[EventBase]:
    """The new log: the node registers again, the controller re-assembles (INITIAL), the agent
    re-asserts READY (same pid), then `then`."""
    register, assemble = instance_events(3, Role.UNION, state=None, status=None)[:2]
    return [register, assemble, endpoint_status("n3", 0, READY, 3, pid=100), *then]


def routable_along(t: RoutingTable, events: list[EventBase]) -> list[bool]:
    out = []
    for seq, ev in enumerate(events, 1):
        t.apply(ev, seq)
        out.append(bool(t.candidates(Role.UNION, "motor-sim")))
    return out


def test_the_new_logs_initial_does_not_unroute_the_same_engine() -> None:
    """Regression (`just chaos`, MOTOR deleted and recreated under load: 81 of 134 requests got
    503 `no routable instance (instance 1 is INITIAL …)` for the ~3 s the controller took to
    re-adopt instances whose engines never stopped)."""
    t = serving()
    t.hold_across_loss()
    assert routable_along(t, readopted([instance_state(3, InstanceState.ACTIVE)])) == [True] * 4


def test_without_a_lost_log_initial_is_not_routed() -> None:
    t = serving()
    assert routable_along(t, readopted([])) == [False, False, False]


@pytest.mark.parametrize(
    ("worse", "why"),
    [
        (endpoint_status("n3", 0, DEAD, 3, pid=100, previous=READY), "instance 3 is INITIAL"),
        (endpoint_status("n3", 0, READY, 3, pid=200), "instance 3 is INITIAL"),  # another process
        (instance_state(3, InstanceState.ISOLATED), "instance 3 is ISOLATED"),
        (alarm(3), "instance 3 is INITIAL"),  # a precision alarm is never held over
    ],
)
def test_the_new_log_saying_something_worse_ends_the_hold(worse: EventBase, why: str) -> None:
    t = serving()
    t.hold_across_loss()
    assert routable_along(t, readopted([worse])) == [True, True, True, False]
    (row,) = t.describe()
    assert not row["routable"] and row["reason"] == why


def test_released_the_new_log_alone_decides() -> None:
    t = serving()
    t.hold_across_loss()
    assert routable_along(t, readopted([])) == [True, True, True]
    t.release_hold()
    assert not t.candidates(Role.UNION, "motor-sim")
