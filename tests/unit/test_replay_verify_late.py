"""`motor replay --verify` and the leader's fold: a decision made before a concurrent fact was
folded is reproduced on that earlier fold, not reported as drift (found by the seeded
simulator, tests/sim, seed 147)."""

from __future__ import annotations

from dataclasses import dataclass

from controller.decide import decide
from core import subjects
from core.events import EndpointStatus, EventBase, InstanceState, InstanceStateChanged
from replay.verify import verify
from tests.unit.controller_log import Log, config


@dataclass(frozen=True)
class Rec:
    seq: int
    subject: str
    event: EventBase


def _records(log: Log) -> list[Rec]:
    return [Rec(seq, subjects.for_event(ev), ev) for seq, ev in log.events]


def _race() -> Log:
    """An agent restarted and registered again (its endpoint STARTING); the leader decides on
    that fold (DEGRADED) while the agent's READY lands, before the decision."""
    log = Log(config(union=1))
    log.register("n1")
    log.bring_up()
    assert log.inst(1) == InstanceState.ACTIVE
    log.register("n1", ip="10.0.0.1", instance_id=1, running_endpoints=(0,))
    decided = log.decide()
    assert [d.event.data.state for d in decided] == [InstanceState.DEGRADED]  # type: ignore[attr-defined]
    log.status("n1", 0, EndpointStatus.READY, reason="re-asserted after registering again")
    log.commit(decided)
    log.settle()
    return log


def test_seed_147_a_decision_made_before_a_concurrent_ready_was_folded_is_reproduced_late() -> None:
    log = _race()
    report = verify(_records(log), lambda s, t: decide(s, log.cfg, t))
    assert report.ok, [m.render() for m in report.mismatches]
    assert report.late == 1


def test_a_decision_no_fold_gives_is_still_reported() -> None:
    log = _race()
    records = _records(log)
    forged = []
    for r in records:
        ev = r.event
        if isinstance(ev, InstanceStateChanged) and ev.data.state == InstanceState.DEGRADED:
            ev = ev.model_copy(update={"id": "f" * 32})
        forged.append(Rec(r.seq, r.subject, ev))
    report = verify(forged, lambda s, t: decide(s, log.cfg, t))
    assert [m.seq for m in report.mismatches] == [r.seq for r in forged if r.event.id == "f" * 32]
