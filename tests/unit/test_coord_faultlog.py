"""The coordinator's fault log: circuit changes at once, stream outcomes one event per endpoint and
window, and what `motor replay --explain` and the timeline make of them."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from coordinator.breaker import Breakers, BreakerState, CircuitChange
from coordinator.faultlog import FaultLog
from coordinator.table import RoutingTable
from core import codec, subjects
from core.bounds import MAX_COUNT, MAX_TIMESTAMP
from core.events import CircuitChanged, EndpointStatus, Role, StreamsDisrupted
from core.reducer import apply
from core.state import ClusterState
from replay.explain import explain
from replay.timeline import build_lanes
from tests.unit.coord_events import endpoint_status, instance_events, refreshed, seed_instance


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@dataclass
class Rec:
    seq: int
    subject: str
    event: Any


def pd_table() -> RoutingTable:
    t = RoutingTable()
    seq = 0
    for iid, role in ((1, Role.UNION), (2, Role.PREFILL), (3, Role.DECODE)):
        for ev in instance_events(iid, role, capabilities=("handoff",), status=None):
            seq += 1
            t.apply(ev, seq)
        seq += 1
        t.apply(endpoint_status(f"n{iid}", 0, EndpointStatus.READY, iid, pid=4000 + iid), seq)
    return t


def faultlog(t: RoutingTable, clock: Clock) -> tuple[FaultLog, list[Any]]:
    out: list[Any] = []
    return FaultLog(t, out.append, coordinator="coord-a", source="coordinator/coord-a", clock=clock), out


def test_a_circuit_change_is_one_event_naming_endpoint_instance_and_incarnation() -> None:
    t, clock = pd_table(), Clock()
    log, out = faultlog(t, clock)
    b = Breakers(failures=2, backoff_initial=30, on_change=log.circuit)
    b.failure("n3/0", "transport: engine closed the connection")
    b.failure("n3/0", "transport: engine closed the connection")
    (ev,) = out
    assert isinstance(ev, CircuitChanged)
    d = ev.data
    assert (d.endpoint, d.node_id, d.endpoint_id, d.instance_id, d.role) == ("n3/0", "n3", 0, 3, Role.DECODE)
    assert (d.state, d.failures, d.backoff_s, d.pid) == ("open", 2, 30, 4003)
    assert d.reason == "transport: engine closed the connection" and d.coordinator == "coord-a"
    assert subjects.for_event(ev) == "motor.evt.circuit.n3"
    b.reset("n3/0", "new incarnation (pid 5003)")
    assert out[-1].data.state == "closed" and out[-1].data.reason == "new incarnation (pid 5003)"
    # Half-open is a moment, not a decision: nothing is written for it.
    log.circuit(CircuitChange("n3/0", BreakerState.HALF_OPEN, ""))
    assert len(out) == 2


def test_a_circuit_change_past_what_an_event_may_carry_is_written_at_the_bound() -> None:
    """Issue 24: an infinite backoff (`breaker.backoff_max: .inf`) made the circuit change
    raise in the request that opened it; a count past MAX_COUNT likewise."""
    t, clock = pd_table(), Clock()
    log, out = faultlog(t, clock)
    log.circuit(CircuitChange("n3/0", BreakerState.OPEN, "x", failures=2**40, backoff=math.inf))
    (ev,) = out
    assert (ev.data.failures, ev.data.backoff_s) == (MAX_COUNT, MAX_TIMESTAMP)
    assert codec.decode(codec.encode(ev)) == ev


def test_stream_outcomes_are_one_event_per_endpoint_and_window() -> None:
    t, clock = pd_table(), Clock()
    log, out = faultlog(t, clock)
    for i in range(1000):  # a storm: 1000 streams broke on the decode …
        log.broken("n3/0", "transport")
        log.continued("n3/0", "n1/0" if i % 4 else "n3/0-never")
    log.broken("n3/0", "stall")
    log.failed("n3/0")
    log.retried("n2/0", "timeout")
    assert out == []  # nothing before the window ends
    clock.t += 1.0
    log.flush()
    assert [type(e) for e in out] == [StreamsDisrupted, StreamsDisrupted]  # … one event each
    by = {e.data.endpoint: e.data for e in out}
    d = by["n3/0"]
    assert (d.broken, d.continued, d.failed, d.retried) == (1001, 1000, 1, 0)
    assert d.reasons == {"transport": 1000, "stall": 1}
    assert d.continued_on == {"n1/0": 750, "n3/0-never": 250}
    assert (d.instance_id, d.role, d.since, d.until) == (3, Role.DECODE, 1000.0, 1001.0)
    assert by["n2/0"].retried == 1 and by["n2/0"].reasons == {"timeout": 1}
    log.flush()
    assert len(out) == 2  # an empty window writes nothing
    for e in out:  # the events survive the codec (they travel as JSON)
        assert codec.decode(codec.encode(e)) == e


def test_external_endpoints_have_a_subject_too() -> None:
    t, clock = RoutingTable(), Clock()
    t.apply(refreshed([seed_instance(7, 85)]), 1)
    log, out = faultlog(t, clock)
    log.retried("ext/7", "transport")
    log.flush()
    (ev,) = out
    assert ev.data.node_id is None and ev.data.instance_id == 7
    assert subjects.for_event(ev) == "motor.evt.streams.ext-7"


def test_explain_and_timeline_show_the_coordinators_view_beside_the_engines_facts() -> None:
    t, clock = pd_table(), Clock()
    log, out = faultlog(t, clock)
    b = Breakers(failures=3, backoff_initial=30, on_change=log.circuit)
    events: list[Any] = [
        endpoint_status("n3", 0, EndpointStatus.DEAD, 3, pid=4003, previous=EndpointStatus.READY)
    ]
    for _ in range(16):
        b.failure("n3/0", "transport: engine closed the connection")
        log.broken("n3/0", "transport")
        log.continued("n3/0", "n1/0")
    clock.t += 1
    log.flush()
    b.reset("n3/0", "new incarnation (pid 5003)")
    events += out
    recs = [Rec(i + 100, subjects.for_event(e), e) for i, e in enumerate(events)]
    state = ClusterState()
    for r in recs:  # the reducer folds them without a change of lifecycle state
        after = apply(state, r.event, r.seq)
        assert after.instances == state.instances and after.nodes == state.nodes
        state = after
    text = "\n".join(line.summary for line in explain(recs, "instance", "3"))
    assert "circuit of n3/0 closed by coord-a, incarnation pid 4003: new incarnation (pid 5003)" in text
    assert "circuit of n3/0 opened by coord-a for 30 s after 3 failures, incarnation pid 4003" in text
    assert "16 streams broke (transport ×16): 16 continued on n1/0 ×16, 0 failed" in text
    assert "endpoint n3/0 READY → DEAD" in text
    node = "\n".join(line.summary for line in explain(recs, "node", "n3"))
    assert "16 streams broke" in node
    lanes = [ln.key for ln in build_lanes(recs)[0]]
    i = lanes.index("endpoint-n3-0")
    assert lanes[i : i + 3] == ["endpoint-n3-0", "endpoint-n3-0-circuit", "endpoint-n3-0-streams"]
