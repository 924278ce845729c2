"""Issue 21: drain, cordon, scale and rolling restart as the controller's decisions, on the fold."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.derive import derive
from coordinator.losshold import LossHold
from core.events import (
    DrainRequested,
    DrainRequestedData,
    InstanceState,
    Role,
    RolloutRequested,
    RolloutRequestedData,
    ScaleRequested,
    ScaleRequestedData,
    Uncordoned,
    UncordonedData,
)
from core.state import state_from_dict, state_to_dict
from deploy.cmd_lifecycle import drain_progress, parse_scale, rollout_progress, scale_progress
from tests.unit.controller_log import Log, config


def up(union: int = 1, nodes: int = 1, **kw: Any) -> Log:
    log = Log(config(union=union, **kw))
    log.lead(1)
    for i in range(nodes):
        log.register(f"n{i + 1}")
    log.bring_up()
    return log


def drain(log: Log, *, instance: int | None = None, node: str | None = None, timeout: float = 30.0) -> int:
    target = "node" if node is not None else "instance"
    data = DrainRequestedData(
        drain_id=log._id("drain"), target=target, instance_id=instance, node_id=node, timeout=timeout
    )
    return log.add(DrainRequested(id=log._id("dev"), ts=log.now, source="operator", data=data))


def scale(log: Log, role: Role, n: int) -> int:
    data = ScaleRequestedData(role=role, instances=n)
    return log.add(ScaleRequested(id=log._id("scale"), ts=log.now, source="operator", data=data))


def rollout(log: Log, model: str = "motor-sim") -> str:
    rid = log._id("roll")
    data = RolloutRequestedData(rollout_id=rid, model=model)
    log.add(RolloutRequested(id=log._id("rev"), ts=log.now, source="operator", data=data))
    return rid


def routable(log: Log) -> dict[str, tuple[bool, bool]]:
    d = derive(log.state, {}, {}, LossHold())
    return {k: (v.routable, v.failed) for k, v in d.items()}


# --------------------------------------------------------------------------- drain


def test_a_drained_instance_leaves_routing_at_once_stops_gracefully_then_terminates() -> None:
    log = up()
    assert routable(log) == {"n1/0": (True, False)}
    drain(log, instance=1, timeout=12.0)
    # Out of routing for new requests, but not failed: what it carries goes on.
    assert routable(log) == {"n1/0": (False, False)}
    stops = log.step()
    assert log.types(stops) == ["command.stop:n1"]
    assert stops[0].event.data.drain_timeout == 12.0  # type: ignore[union-attr]
    assert log.step() == []  # waiting for the node to finish and answer
    log.tick(5.0)
    assert log.step() == []
    log.agents()  # the node agent's stop: applied once its engines went idle
    done = log.step()
    assert log.types(done) == ["instance.state_changed:TERMINATED"]
    assert "drained" in done[0].event.data.reason  # type: ignore[union-attr]
    assert 1 not in log.state.ops.drains
    # An instance drain frees its nodes: a fresh instance is built on them.
    log.bring_up()
    assert [i.state for i in log.state.instances.values()] == [InstanceState.ACTIVE]
    assert list(log.state.instances) == [2]


def test_a_node_that_never_answers_holds_its_drain_only_so_long() -> None:
    log = up()
    drain(log, instance=1, timeout=10.0)
    log.step()
    log.tick(10.0 + 30.0 - 1)
    assert log.step() == []
    log.tick(2.0)
    assert log.types(log.step()) == ["instance.state_changed:TERMINATED"]


def test_a_draining_instance_is_not_restarted_when_its_engines_stop() -> None:
    log = up()
    drain(log, instance=1)
    log.step()
    log.status("n1", 0, "STOPPED", "stopped by command")  # the engine stops before the answer lands
    assert log.types(log.step()) == []  # no restart: it is draining
    log.agents()
    assert log.types(log.step()) == ["instance.state_changed:TERMINATED"]


def test_a_node_drain_cordons_it_until_uncordoned() -> None:
    log = up()
    drain(log, node="n1")
    assert log.state.ops.cordoned == {"n1"}
    log.step()
    log.agents()
    log.settle()
    assert not log.state.instances  # nothing is built on a cordoned node
    log.tick(60.0)
    assert log.settle() == []
    log.add(Uncordoned(id="u1", ts=log.now, source="operator", data=UncordonedData(node_id="n1")))
    assert log.state.ops.cordoned == frozenset()
    log.bring_up()
    assert [i.state for i in log.state.instances.values()] == [InstanceState.ACTIVE]


def test_a_second_drain_of_the_same_instance_keeps_the_first_clock() -> None:
    log = up()
    first = drain(log, instance=1)
    log.tick(5.0)
    drain(log, instance=1)
    assert log.state.ops.drains[1].seq == first


def test_drains_cordons_scale_and_rollouts_survive_a_checkpoint() -> None:
    log = up(union=2, nodes=3)
    drain(log, node="n1")
    scale(log, Role.UNION, 1)
    rollout(log)
    again = state_from_dict(state_to_dict(log.state))
    assert again.ops == log.state.ops


# --------------------------------------------------------------------------- scale


def test_scale_down_drains_the_newest_and_scale_up_takes_free_nodes() -> None:
    log = up(union=2, nodes=3)
    assert sorted(log.state.instances) == [1, 2]
    scale(log, Role.UNION, 1)
    ds = log.step()
    assert log.types(ds) == ["operator.drain_requested"]
    assert ds[0].event.data.instance_id == 2  # type: ignore[union-attr]
    log.bring_up()
    assert sorted(log.state.instances) == [1]
    scale(log, Role.UNION, 3)
    log.bring_up()
    assert len(log.state.instances) == 3  # the spare node and the freed one
    assert all(i.state == InstanceState.ACTIVE for i in log.state.instances.values())


# --------------------------------------------------------------------------- rolling restart


def _history(log: Log, rounds: int = 40) -> list[tuple[int, ...]]:
    """Bring the cluster along round by round; record the ACTIVE, non-draining instances of each."""
    seen: list[tuple[int, ...]] = []
    for _ in range(rounds):
        log.step()
        log.agents()
        active = tuple(
            sorted(
                i
                for i, r in log.state.instances.items()
                if r.state == InstanceState.ACTIVE and i not in log.state.ops.drains
            )
        )
        if not seen or seen[-1] != active:
            seen.append(active)
        if not log.state.ops.rollouts and not log.decide():
            break
    return seen


@pytest.mark.parametrize("spare", [False, True])
def test_a_rolling_restart_replaces_every_instance_one_at_a_time(spare: bool) -> None:
    log = up(union=2, nodes=3 if spare else 2)
    rid = rollout(log)
    line, done = rollout_progress(log.state, rid, "motor-sim")
    assert not done and "2 to go" in line
    seen = _history(log)
    assert not log.state.ops.rollouts
    assert all(i > 2 for i in log.state.instances)  # every old instance was replaced
    assert len(log.state.instances) == 2
    # Never fewer than one instance serving; with a spare node, never fewer than two.
    assert min(len(s) for s in seen) >= (2 if spare else 1)
    completed = [ev for _, ev in log.events if ev.type == "controller.rollout_completed"]
    assert len(completed) == 1 and set(completed[0].data.replaced) == {1, 2}  # type: ignore[attr-defined]
    assert rollout_progress(log.state, rid, "motor-sim")[1]


# --------------------------------------------------------------------------- the CLI's pure parts


def test_scale_targets_are_parsed_and_bad_ones_named() -> None:
    assert parse_scale(["union=2", "decode=0"]) == {"union": 2, "decode": 0}
    for bad, words in (
        ("gpu=2", "ROLE one of"),
        ("union", "ROLE=N"),
        ("union=x", "whole"),
        ("union=-1", "0 or more"),
    ):
        with pytest.raises(ValueError, match=words):
            parse_scale([bad])


def test_drain_and_scale_progress_say_where_they_are() -> None:
    log = up(union=2, nodes=2)
    drain(log, instance=2)
    assert drain_progress(log.state, 2) == ("instance 2 draining: n2: out of routing", False)
    log.step()
    line, done = drain_progress(log.state, 2)
    assert "finishing what it carries (at most 30s)" in line and not done
    assert scale_progress(log.state, {"union": 1}) == ("union: 1/1 ACTIVE, 1 draining", False)
    log.agents()
    log.step()
    assert drain_progress(log.state, 2) == ("instance 2 drained and stopped", True)
    assert scale_progress(log.state, {"union": 1}) == ("union: 1/1 ACTIVE", True)
