"""The pure parts of "no request waits on an engine that left routing": the table says which
endpoint left and why, once per burst of events; the hedge delay follows the endpoint's own
recent time to first byte within its bounds; a race has one winner."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from coordinator.endpoint import Endpoint
from coordinator.proxy.hedge import Hedger, Race
from coordinator.table import RoutingTable
from core.coordconfig import HedgeConfig
from core.events import EndpointStatus, EventBase, InstanceState, Role
from tests.unit.coord_events import endpoint_status, instance_events, instance_state


class Watched:
    """A table whose leave checks run when the test says (the loop's call_soon, by hand)."""

    def __init__(self) -> None:
        self.t = RoutingTable()
        self.left: list[tuple[str, str]] = []
        self.soon: list[Callable[[], None]] = []
        self.t.on_leave = lambda key, why: self.left.append((key, why))
        self.t.schedule = self.soon.append
        self.seq = 0

    def apply(self, *events: EventBase) -> None:
        for ev in events:
            self.seq += 1
            self.t.apply(ev, self.seq)

    def run_soon(self) -> None:
        due, self.soon[:] = list(self.soon), []
        for f in due:
            f()


def two_unions() -> Watched:
    w = Watched()
    w.apply(*instance_events(1, Role.UNION), *instance_events(2, Role.UNION))
    w.run_soon()
    assert [e.key for e in w.t.routable()] == ["n1/0", "n2/0"] and w.left == []
    return w


@pytest.mark.parametrize(
    ("event", "why"),
    [
        (endpoint_status("n1", 0, EndpointStatus.ABNORMAL, 1), "abnormal"),
        (endpoint_status("n1", 0, EndpointStatus.DEAD, 1), "dead"),
        (instance_state(1, InstanceState.ISOLATED), "isolated"),
        (instance_state(1, InstanceState.INACTIVE), "inactive"),
        (instance_state(1, InstanceState.TERMINATED), "gone from the log"),
    ],
)
def test_an_endpoint_that_stops_being_routable_is_said_to_leave(event: EventBase, why: str) -> None:
    w = two_unions()
    w.apply(event)
    assert w.left == []  # said when the loop gets to it, not inside the fold
    w.run_soon()
    assert [k for k, _ in w.left] == ["n1/0"]
    assert why in w.left[0][1].lower()


@pytest.mark.parametrize(
    "event",
    [
        instance_state(1, InstanceState.INITIAL),  # re-assembled (a lost log's re-adoption)
        instance_state(1, InstanceState.RECOVERING),
        endpoint_status("n1", 0, EndpointStatus.STARTING, 1),
    ],
)
def test_an_endpoint_between_states_leaves_routing_without_ending_its_requests(event: EventBase) -> None:
    w = two_unions()
    w.apply(event)
    w.run_soon()
    assert [e.key for e in w.t.routable()] == ["n2/0"]  # no new request goes there
    assert w.left == []  # but what it serves goes on: its engine did not fail


def test_a_burst_of_events_is_checked_once_and_nothing_left_says_nothing() -> None:
    w = two_unions()
    w.apply(*instance_events(3, Role.UNION), endpoint_status("n2", 0, EndpointStatus.READY, 2))
    assert len(w.soon) == 1
    w.run_soon()
    assert w.left == []


def test_a_read_that_rebuilds_first_still_reports_the_leave() -> None:
    w = two_unions()
    w.apply(endpoint_status("n2", 0, EndpointStatus.ABNORMAL, 2))
    assert [e.key for e in w.t.routable()] == ["n1/0"]  # a request's read rebuilt the index
    assert [k for k, _ in w.left] == ["n2/0"]
    w.run_soon()
    assert len(w.left) == 1  # not twice


CFG = HedgeConfig(factor=4.0, min_delay=0.5)


@pytest.mark.parametrize(
    ("ttft", "first_token_timeout", "delay"),
    [
        (0.05, 60.0, 0.5),  # a fast engine: the floor
        (0.5, 60.0, 2.0),  # factor × its recent time to first byte
        (0.0, 60.0, 30.0),  # no history yet: half the first-token timeout
        (0.0, 0.4, None),  # ... which the floor puts past the timeout: never hedged
        (20.0, 60.0, None),  # a slow engine: the first-token timeout comes first
    ],
)
async def test_hedge_delay(ttft: float, first_token_timeout: float, delay: float | None) -> None:
    h = Hedger(CFG, first_token_timeout, lose=lambda rid: 0)
    at, ep = At("r#a1"), endpoint()
    at.t0, ep.ttft = 100.0, ttft
    h.watch(at, ep)  # type: ignore[arg-type]
    assert at.hedger is h
    if delay is None:
        assert at not in h.due
    else:
        assert h.due[at] - at.t0 == pytest.approx(delay)  # type: ignore[index]
    if h._sweeper is not None:
        h._sweeper.cancel()


def endpoint(key: str = "n1/0") -> Endpoint:
    return Endpoint(key, 1, Role.UNION, "builtin", "m", "127.0.0.1", 9000, None, frozenset(), None)


def test_recent_time_to_first_byte_follows_the_engine() -> None:
    now = [0.0]
    h = Hedger(CFG, 60.0, lose=lambda rid: 0, clock=lambda: now[0])
    ep = endpoint()
    for took in (0.1, *([1.0] * 30)):
        at = At("r#a1")
        at.t0, now[0] = now[0], now[0] + took
        assert h.claim(at, ep)  # type: ignore[arg-type]
        if took == 0.1:
            assert ep.ttft == pytest.approx(0.1)  # the first one is taken as it is
    assert ep.ttft == pytest.approx(1.0, abs=0.01)


class At:
    """An attempt as the hedger sees it."""

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.t0 = 0.0
        self.hedger: Hedger | None = None
        self.race: Race | None = None


def racing() -> tuple[Hedger, At, At, list[str]]:
    lost: list[str] = []
    h = Hedger(CFG, 60.0, lose=lambda rid: lost.append(rid) or 1, clock=lambda: 1.0)
    first, hedge = At("r#a1"), At("r#a2")
    first.race = hedge.race = Race(first, hedge)  # type: ignore[arg-type]
    h.racing = 1
    return h, first, hedge, lost


def test_the_hedge_answering_first_ends_the_first_attempts_exchanges() -> None:
    h, first, hedge, lost = racing()
    assert h.claim(hedge, endpoint("n2/0"))  # type: ignore[arg-type]
    assert lost == ["r#a1"] and h.racing == 0
    assert not h.claim(first, endpoint())  # type: ignore[arg-type]  # its late answer goes nowhere


def test_a_hedge_that_fails_leaves_the_first_attempt_alone_in_the_race() -> None:
    h, first, hedge, lost = racing()
    h.ended(hedge)  # type: ignore[arg-type]
    assert h.racing == 0
    assert h.claim(first, endpoint())  # type: ignore[arg-type]
    assert lost == []


def test_an_attempt_with_no_race_always_claims() -> None:
    h = Hedger(CFG, 60.0, lose=lambda rid: 0, clock=lambda: 2.0)
    at = At("r#a1")
    at.t0 = 1.5
    ep = endpoint()
    assert h.claim(at, ep)  # type: ignore[arg-type]
    assert ep.ttft == pytest.approx(0.5)  # what the hedge delay of its next request follows
