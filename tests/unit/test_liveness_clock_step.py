"""Issue 24 item 4: liveness must not compare two machines' wall clocks.

Silence was a node's heartbeat `ts` (its wall clock) against the controller's `now` (its own):
a node an hour behind was failed over while it beat, one an hour ahead never, and a
controller whose clock stepped forward terminated every healthy instance. Each clock is
stepped both ways here; healthy nodes are never judged silent, and a truly silent node is
judged silent exactly when its silence, on the controller's monotonic clock, says so.
"""

from __future__ import annotations

import pytest

from controller.decide import decide
from core.events import InstanceState
from tests.unit.controller_log import Log, config

HOUR = 3600.0
EPOCH = 1_800_000_000.0  # wall clocks an hour back stay valid timestamps


def up(skew: dict[str, float] | None = None) -> Log:
    log = Log(config(union=1, nnodes=2), now=EPOCH)
    log.skew.update(skew or {})
    log.register("n1")
    log.register("n2")
    log.bring_up()
    assert log.inst(1) == InstanceState.ACTIVE
    return log


def silent(log: Log, node: str, seconds: float) -> None:
    """Time passes; everyone but `node` heartbeats."""
    log.tick(seconds, heartbeats=False)
    for nid in log.state.nodes:
        if nid != node:
            log.heartbeat(nid)


def state_moves(log: Log) -> list[str]:
    return [t for t in log.types(log.decide()) if t.startswith("instance.state_changed")]


@pytest.mark.parametrize("skew", [-HOUR, HOUR], ids=["node-behind", "node-ahead"])
def test_a_healthy_node_is_never_judged_by_its_own_clock(skew: float) -> None:
    log = up({"n2": skew})
    for _ in range(12):  # two minutes of healthy beats: past heartbeat_timeout and terminate_after
        log.tick(10.0)
        assert log.decide() == []
    assert log.inst(1) == InstanceState.ACTIVE


@pytest.mark.parametrize("skew", [-HOUR, 0.0, HOUR], ids=["node-behind", "node-right", "node-ahead"])
def test_a_silent_node_is_judged_on_the_controllers_steady_clock_whatever_its_own(skew: float) -> None:
    log = up({"n2": skew})
    silent(log, "n2", 10.0)
    assert state_moves(log) == []  # 10 s is the timeout, not past it
    silent(log, "n2", 0.5)
    (d,) = log.step()
    assert log.types([d]) == ["instance.state_changed:INACTIVE"]
    assert "n2 silent for 10.5s" in getattr(d.event.data, "reason", "")
    silent(log, "n2", 49.0)
    assert state_moves(log) == []  # 59.5 s < terminate_after
    silent(log, "n2", 1.0)
    assert "instance.state_changed:TERMINATED" in state_moves(log)


@pytest.mark.parametrize("step", [-HOUR, HOUR], ids=["wall-back", "wall-forward"])
def test_a_controller_wall_clock_step_between_two_decides_judges_nobody(step: float) -> None:
    log = up()
    log.tick(5.0)
    assert log.decide() == []
    log.step_wall(step)
    assert log.decide() == []  # before: an hour forward terminated both nodes' instance at once
    for _ in range(12):
        log.tick(10.0)
        assert log.decide() == []
    assert log.inst(1) == InstanceState.ACTIVE


@pytest.mark.parametrize("step", [-HOUR, HOUR], ids=["wall-back", "wall-forward"])
def test_a_truly_silent_node_is_still_judged_across_a_controller_wall_clock_step(step: float) -> None:
    log = up()
    silent(log, "n2", 5.0)
    log.step_wall(step)
    assert state_moves(log) == []  # 5 s of silence, whatever the wall clock says now
    silent(log, "n2", 5.5)
    assert state_moves(log) == ["instance.state_changed:INACTIVE"]  # before: never, stepped back


def test_both_clocks_off_at_once_change_nothing() -> None:
    log = up({"n1": HOUR, "n2": -HOUR})
    log.step_wall(-HOUR)
    for _ in range(12):
        log.tick(10.0)
        assert log.decide() == []
    silent(log, "n1", 10.5)
    assert state_moves(log) == ["instance.state_changed:INACTIVE"]


def test_without_a_hearing_nobody_is_judged_silent() -> None:
    """`motor replay --verify` has no heartbeats and no monotonic readings: it judges nobody
    (the decisions that rest on heartbeats are counted apart, replay.verify)."""
    log = up()
    silent(log, "n2", 120.0)
    assert state_moves(log) != []
    assert decide(log.state, log.cfg, log.now) == []


def test_a_heartbeat_of_an_unknown_node_is_not_heard_and_a_deregistered_node_is_forgotten() -> None:
    log = up()
    log.heartbeat("stranger")
    assert "stranger" not in log.heard
    log.register("n3")
    assert log.heard["n3"] == log.steady
    log.deregister("n3")
    assert "n3" not in log.heard


def test_a_node_this_controller_never_heard_gets_the_whole_grace_and_the_reason_says_so() -> None:
    """A node from a checkpoint: this process never folded a heartbeat of it."""
    log = up()
    log.heard.pop("n2")
    log.hearing_since = log.steady
    silent(log, "n2", 10.0)
    assert state_moves(log) == []
    silent(log, "n2", 0.5)
    (d,) = log.step()
    assert log.types([d]) == ["instance.state_changed:INACTIVE"]
    reason = getattr(d.event.data, "reason", "")
    assert "n2 silent for 10.5s (not heard since this controller could hear)" in reason
