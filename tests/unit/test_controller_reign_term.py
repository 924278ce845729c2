"""The term a new reign announces: past every term node agents may have obeyed; and what a
node's `stale_term` refusal makes the leader do (announce past it, send the same command again)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from pydantic import ValidationError

from controller.decide import decide
from controller.leadership import reign_term
from controller.state_queries import START_EXHAUSTED, outranking_term, stop_outstanding
from core import subjects
from core.events import CommandRefusedData, EventBase, FaultLevel, InstanceState
from core.state import state_from_dict, state_to_dict
from replay.verify import verify
from tests.unit.controller_log import Log, config


@dataclass
class Rec:
    seq: int
    subject: str
    event: EventBase


@pytest.mark.parametrize(
    ("lease_term", "folded", "floor", "term"),
    [
        (1, None, 0, 1),  # the first reign of a fresh log
        (1, 1, 0, 2),  # a successor: one past the log's last leader
        (5, 2, 0, 5),  # the lease already names a higher reign (an earlier try of ours)
        # After a purge the log names no leader; the agents obeyed term 3 before it: a reign
        # counted from the log alone (1) would have every command refused stale_term.
        (1, None, 3, 4),
        (3, None, 3, 4),
        (1, 2, 3, 4),  # the new log's leader is older than what was folded before the loss
        (1, 7, 3, 8),
    ],
)
def test_a_reign_is_named_past_the_log_and_past_what_was_folded_before_a_lost_log(
    lease_term: int, folded: int | None, floor: int, term: int
) -> None:
    assert reign_term(lease_term, folded, floor) == term


# ----------------------------------------------------------------------------- outranked by a node


def _up(log: Log) -> None:
    log.lead(1)
    log.register("n1")
    log.bring_up()
    assert log.inst(1) == InstanceState.ACTIVE


def _fresh_start(log: Log) -> None:
    """n1 re-registers without engines (as after a purge), so instance 1 is started again."""
    log.register("n1")
    starts = [d for d in log.settle() if d.event.type == "command.start"]
    assert [d.event.data.term for d in starts] == [1]


@pytest.mark.parametrize(
    ("code", "seen_term", "outranked_by"),
    [
        ("stale_term", 3, 3),  # the node names the term it obeyed
        ("stale_term", None, 2),  # an agent from before `seen_term`: newer than the command's (1)
        ("stale_term", 0, 2),  # a node that contradicts itself: still newer than the command's
        ("port_in_use", None, 0),  # any other refusal is a failed attempt, as before
    ],
)
def test_a_refusal_records_the_term_that_outranked_the_command(
    code: str, seen_term: int | None, outranked_by: int
) -> None:
    log = Log(config(union=1))
    _up(log)
    _fresh_start(log)
    log.refused("n1", code, seen_term=seen_term)
    rec = log.state.nodes["n1"].start_cmd
    assert rec is not None and (rec.status, rec.outranked_by) == ("refused", outranked_by)
    assert outranking_term(log.state) == outranked_by
    assert state_from_dict(state_to_dict(log.state)) == log.state


def test_a_negative_seen_term_does_not_decode() -> None:
    with pytest.raises(ValidationError):
        CommandRefusedData(
            command_id="c", node_id="n1", verb="start", code="stale_term", reason="", seen_term=-1
        )


def test_a_start_refused_for_an_older_term_waits_for_a_newer_reign_and_is_no_failed_attempt() -> None:
    log = Log(config(union=1, start_attempts=2))
    _up(log)
    _fresh_start(log)
    log.refused("n1", "stale_term", seen_term=3)
    for _ in range(3):  # long past start_timeout: still nothing to send in a reign of term 1
        log.tick(40.0)
        assert [d.event.type for d in log.step()] == []
    log.lead(4)  # the leader announces past the node's term (controller.leadership.outrank)
    assert outranking_term(log.state) < 4
    starts = [d.event.data for d in log.step() if d.event.type == "command.start"]
    assert [(s.node_id, s.term, s.attempt) for s in starts] == [("n1", 4, 1)]
    log.agents()
    log.settle()
    assert log.inst(1) == InstanceState.ACTIVE
    assert not log.state.faults
    # The start sent again follows from the log alone: `motor replay --verify` re-derives it.
    records = [Rec(seq, subjects.for_event(ev), ev) for seq, ev in log.events]
    report = verify(records, lambda s, t: decide(s, log.cfg, t))
    assert report.ok, [m.render() for m in report.mismatches]


def test_a_start_refused_for_another_reason_counts_until_retries_are_exhausted() -> None:
    log = Log(config(union=1, start_attempts=2))
    _up(log)
    _fresh_start(log)
    log.refused("n1", "port_in_use")
    again = [d.event.data for d in log.step() if d.event.type == "command.start"]
    assert [s.attempt for s in again] == [2]
    log.refused("n1", "port_in_use")
    assert [d.event.data.code for d in log.step() if d.event.type == "fault.reported"] == [START_EXHAUSTED]


def test_a_stop_refused_for_an_older_term_keeps_the_node_out_of_assembly_until_sent_again() -> None:
    log = Log(config(union=1))
    _up(log)
    fid = log.fault("n1", FaultLevel.L5)
    assert "instance.state_changed:TERMINATED" in log.types(log.settle())
    log.refused("n1", "stale_term", verb="stop", seen_term=3)
    log.clear_fault(fid)
    assert stop_outstanding(log.state.nodes["n1"])
    assert log.step() == []  # n1 is free but its stop did not take: no new instance on it yet
    log.lead(4)
    ds = log.step()
    assert [(d.event.type, d.event.data.term) for d in ds] == [("command.stop", 4)]
    log.agents()
    assert not stop_outstanding(log.state.nodes["n1"])
    assert "instance.assembled" in [d.event.type for d in log.settle()]
