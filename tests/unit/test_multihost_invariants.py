"""Table tests of the multi-host suite's invariants (tests/multihost/invariants.py)."""

from __future__ import annotations

from typing import Any

from streams.placement import StreamPlacement
from tests.chaos.invariants import Entry
from tests.multihost import invariants as mh

CUT, HEAL = 100.0, 120.0


def e(seq: int, etype: str, ts: float, source: str = "controller/c2", **data: Any) -> Entry:
    return Entry(seq, "motor.evt.x", etype, ts, data, source=source)


def test_acked_kept_passes_only_when_every_acknowledged_event_is_in_the_log() -> None:
    assert mh.acked_kept({"acked": 40, "missing": []}).ok
    lost = mh.acked_kept({"acked": 40, "missing": [{"id": "x1", "type": "command.start", "seq": 12}]})
    assert not lost.ok and "1 of 40" in lost.detail and "x1" in lost.detail
    assert not mh.acked_kept({"acked": 0, "missing": []}).ok  # nothing journaled proves nothing
    assert not mh.acked_kept(None, "motor events acked: no journal").ok


def test_the_cut_side_appending_a_decision_while_cut_fails() -> None:
    before = [e(1, "instance.state_changed", CUT - 5, "controller/c1")]
    assert mh.minority_decided_nothing(before, ["controller/c1", "nodeagent/u0"], CUT, HEAL).ok
    late = [*before, e(2, "command.start", CUT + 3, "controller/c1")]
    check = mh.minority_decided_nothing(late, ["controller/c1"], CUT, HEAL)
    assert not check.ok and "command.start by controller/c1" in check.detail
    # What landed in the moment of the cut was on the wire already.
    assert mh.minority_decided_nothing(
        [e(3, "command.start", CUT + 0.5, "controller/c1")], ["controller/c1"], CUT, HEAL
    ).ok
    # After the heal it may lead again, under a reign it announced.
    again = [
        e(4, "controller.leader_changed", HEAL + 5, "controller/c1"),
        e(5, "command.start", HEAL + 6, "controller/c1"),
    ]
    assert mh.minority_decided_nothing(again, ["controller/c1"], CUT, HEAL).ok
    # Node agents report facts, not decisions: theirs are not judged here.
    assert mh.minority_decided_nothing(
        [e(6, "node.registered", CUT + 5, "nodeagent/u0")], ["nodeagent/u0"], CUT, HEAL
    ).ok


def test_the_majority_must_elect_take_the_cut_instances_out_and_keep_its_own() -> None:
    fine = [
        e(1, "controller.leader_changed", CUT + 3),
        e(2, "instance.state_changed", CUT + 9, instance_id=2, state="INACTIVE"),
    ]
    assert mh.majority_went_on(
        fine, cut_at=CUT, healed_at=HEAL, leader_was_cut=True, cut_instances=[2], other_instances=[1, 3]
    ).ok
    no_leader = mh.majority_went_on(
        fine[1:], cut_at=CUT, healed_at=HEAL, leader_was_cut=True, cut_instances=[2]
    )
    assert not no_leader.ok and "no controller announced" in no_leader.detail
    assert mh.majority_went_on(
        fine[1:], cut_at=CUT, healed_at=HEAL, leader_was_cut=False, cut_instances=[2]
    ).ok
    kept = mh.majority_went_on(fine[:1], cut_at=CUT, healed_at=HEAL, leader_was_cut=True, cut_instances=[2])
    assert not kept.ok and "[2]" in kept.detail
    lost_own = [*fine, e(3, "instance.state_changed", CUT + 6, instance_id=3, state="INACTIVE")]
    check = mh.majority_went_on(
        lost_own, cut_at=CUT, healed_at=HEAL, leader_was_cut=True, cut_instances=[2], other_instances=[1, 3]
    )
    assert not check.ok and "[3] of the hosts that were not cut" in check.detail


def test_a_start_for_a_cut_instance_after_the_cut_means_its_engine_was_restarted() -> None:
    assert mh.no_start_for([e(1, "command.start", CUT - 10, instance_id=2)], [2], CUT).ok
    check = mh.no_start_for([e(2, "command.start", CUT + 30, instance_id=2, node_id="union-0")], [2], CUT)
    assert not check.ok and "union-0" in check.detail
    assert mh.no_start_for([e(3, "command.start", CUT + 30, instance_id=5)], [2], CUT).ok


def test_a_new_log_leader_within_the_election_time() -> None:
    p = StreamPlacement("MOTOR", 3, "n2")
    assert mh.log_leader_elected("n1", p, 5.0, 10.0).ok
    assert not mh.log_leader_elected("n1", p, 12.0, 10.0).ok
    assert not mh.log_leader_elected("n1", StreamPlacement("MOTOR", 3, None), None, 10.0).ok
