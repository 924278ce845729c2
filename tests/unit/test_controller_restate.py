"""decide restates long-lived instances before MOTOR's age-out (issue 24 item 3).

A log whose `max_age` is two minutes: an instance assembled more than one minute ago is
restated, a young one is not; restating changes nothing a fold that knows the instance
routes, restarts or counts; and a fold of only what the log still holds after the original
facts aged out (a fresh coordinator's) sees the instance ACTIVE and routes to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from controller.decide import decide
from controller.restate import RESTATE_PER_TICK
from coordinator.table import RoutingTable
from core import subjects
from core.config import NatsConfig
from core.events import EndpointStatus, EventBase, InstanceRestated, InstanceState
from core.reducer import apply, fold
from core.state import ClusterState, state_from_dict, state_to_dict
from replay.verify import verify
from streams.definitions import DEDUPE_WINDOW, MOTOR_STREAM, stream_configs
from tests.unit.controller_log import Log, config

MAX_AGE = 120.0  # seconds


def short_log(n: int = 1, **cfg: Any) -> Log:
    base = config(union=n, **cfg)
    log = Log(base.model_copy(update={"nats": NatsConfig(max_age_days=MAX_AGE / 86400)}))
    for i in range(1, n + 1):
        log.register(f"n{i}")
    log.bring_up()
    for i in range(1, n + 1):
        assert log.inst(i) == InstanceState.ACTIVE
    return log


def routing_view(state: ClusterState) -> dict[str, Any]:
    """What a restatement must not change: everything but its own bookkeeping."""
    raw = state_to_dict(state)
    for key in ("last_seq", "last_ts", "events_applied"):
        raw.pop(key)
    for inst in raw["instances"].values():
        inst.pop("restated_ts")
    return raw


def restate_node(log: Log, node_id: str) -> None:
    """What the node agent says against age-out: its registration again, then its READY."""
    node = log.state.nodes[node_id]
    log.register(
        node_id,
        ip=node.reg.pod_ip,
        restated=True,
        instance_id=node.instance_id,
        running_endpoints=tuple(e.id for e in node.reg.endpoints),
    )
    for e in node.reg.endpoints:
        log.status(node_id, e.id, EndpointStatus.READY, reason="re-asserted")


def test_an_instance_assembled_long_ago_is_restated_and_a_young_one_is_not() -> None:
    log = short_log()
    log.tick(MAX_AGE / 2 - 1)
    assert log.decide() == []
    log.tick(2)
    (d,) = log.decide()
    assert log.types([d]) == ["instance.restated:ACTIVE"]
    assert isinstance(d.event, InstanceRestated)
    assert d.event.data.spec == log.state.instances[1].spec


def test_restating_changes_no_state_that_matters_and_sends_no_command() -> None:
    log = short_log()
    log.tick(MAX_AGE / 2 + 1)
    before = routing_view(log.state)
    (d,) = log.step()
    assert isinstance(d.event, InstanceRestated)
    assert routing_view(log.state) == before
    assert log.state.instances[1].restated_ts == log.now
    assert log.decide() == []  # said again: not due until another half of max_age
    restate_node(log, "n1")  # the agent's restatement moves nothing either: no start again
    assert log.decide() == []
    assert log.inst(1) == InstanceState.ACTIVE
    log.tick(MAX_AGE / 2 + 1)
    assert log.types(log.decide()) == ["instance.restated:ACTIVE"]


def test_a_fold_of_what_survives_age_out_routes_like_the_one_that_saw_it_all() -> None:
    log = short_log(2)
    for _ in range(3):  # three half-lives: the assembly and the READYs aged out long ago
        log.tick(MAX_AGE / 2 + 1)
        log.settle()
        for nid in ("n1", "n2"):
            restate_node(log, nid)
    assert log.decide() == []
    cutoff = log.now - MAX_AGE
    kept: list[tuple[int, EventBase]] = [(q, ev) for q, ev in log.events if ev.ts > cutoff]
    assert not any(ev.type == "instance.assembled" for _, ev in kept)
    fresh = fold(kept)
    for iid in (1, 2):
        assert fresh.instances[iid].state == InstanceState.ACTIVE
        assert fresh.instances[iid].spec == log.state.instances[iid].spec
    table, whole = RoutingTable(), RoutingTable()
    for seq, ev in kept:
        table.apply(ev, seq)
    for seq, ev in log.events:
        whole.apply(ev, seq)
    assert [e.key for e in table.routable()] == [e.key for e in whole.routable()] == ["n1/0", "n2/0"]


def test_a_restated_instance_the_log_terminated_since_stays_terminated() -> None:
    log = short_log()
    log.tick(MAX_AGE / 2 + 1)
    (d,) = log.decide()
    log.deregister("n1")
    log.settle()
    assert log.inst(1) is None
    state = apply(log.state, d.event, log.seq + 1)  # a stale restatement folded late
    assert 1 not in state.instances


def test_an_instance_this_batch_moves_is_restated_next_round() -> None:
    log = short_log()
    log.tick(MAX_AGE / 2 + 1)
    log.status("n1", 0, EndpointStatus.DEAD, reason="exit code -9")
    assert log.types(log.step()) == ["instance.state_changed:ISOLATED"]
    assert log.types(log.step()) == ["instance.state_changed:RECOVERING", "command.stop:n1"]
    # Waiting for its stop the instance is quiet: now it is said again, as it is.
    assert log.types(log.decide()) == ["instance.restated:RECOVERING"]


def test_restatements_are_bounded_per_decide_call() -> None:
    n = RESTATE_PER_TICK + 6
    log = short_log(n)
    log.tick(MAX_AGE / 2 + 1)
    first = log.step()
    assert len(first) == RESTATE_PER_TICK
    assert all(isinstance(d.event, InstanceRestated) for d in first)
    rest = log.step()
    assert len(rest) == 6
    assert log.decide() == []


def test_replay_verify_reproduces_every_restatement() -> None:
    log = short_log(2)
    for _ in range(3):
        log.tick(MAX_AGE / 2 + 1)
        log.settle()
    records = [Rec(seq, subjects.for_event(ev), ev) for seq, ev in log.events]
    assert sum(isinstance(r.event, InstanceRestated) for r in records) == 6
    report = verify(records, lambda st, now: decide(st, log.cfg, now))
    assert report.ok, [m.render() for m in report.mismatches]
    assert report.verified == report.checked - report.unverifiable


@dataclass(frozen=True)
class Rec:
    seq: int
    subject: str
    event: EventBase


def test_a_restated_registration_of_a_node_that_moved_is_a_registration() -> None:
    """Only the same node said again is a no-op: one that came back elsewhere (a restored
    snapshot's new address) is registered as usual, its engines STARTING until they say so."""
    log = short_log()
    before = log.state.nodes["n1"]
    log.register("n1", ip="10.9.9.9", restated=True, instance_id=1, running_endpoints=(0,))
    after = log.state.nodes["n1"]
    assert after.reg.pod_ip == "10.9.9.9" and after.registered_seq > before.registered_seq
    assert after.endpoint_status == {0: EndpointStatus.STARTING}


def test_a_restatement_survives_a_checkpoint() -> None:
    log = short_log()
    log.tick(MAX_AGE / 2 + 1)
    log.step()
    again = state_from_dict(orjson.loads(orjson.dumps(state_to_dict(log.state))))
    assert again.instances[1].restated_ts == log.now


def test_max_age_takes_fractions_of_a_day_down_to_ten_seconds() -> None:
    assert NatsConfig(max_age_days=60 / 86400).max_age_days * 86400 == pytest.approx(60)
    with pytest.raises(ValidationError, match="at least 10 s"):
        NatsConfig(max_age_days=5 / 86400)


def test_a_short_max_age_shortens_the_dedupe_window_with_it() -> None:
    """JetStream refuses a duplicate window longer than max_age."""
    motor = next(c for c in stream_configs(NatsConfig(max_age_days=30 / 86400)) if c.name == MOTOR_STREAM)
    assert motor.max_age == pytest.approx(30) and motor.duplicate_window == pytest.approx(30)
    shipped = next(c for c in stream_configs(NatsConfig()) if c.name == MOTOR_STREAM)
    assert shipped.duplicate_window == DEDUPE_WINDOW
