"""decide: the restart ladder of an engine that crashes after READY — backoff, reset, failover.

The first restart after a crash is immediate; each further crash in a row waits
restart_backoff_initial, doubling up to restart_backoff_max; a crash after the instance served
restart_reset_after starts over; the restart_limit-th crash in a row fails the instance over
(CrashLoop, L5) to a spare node, and its node sits out failover_hold. Every decision is
re-derived by `motor replay --verify` from the log alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from controller.decide import decide
from controller.instance_rules import CRASH_LOOP, restart_delay
from core import subjects
from core.config import ControllerConfig
from core.events import EndpointStatus, EventBase, FaultLevel, InstanceState
from replay.verify import verify
from tests.unit.controller_log import Log, config

LADDER = {"restart_backoff_initial": 1.0, "restart_backoff_max": 60.0, "restart_reset_after": 300.0}


@pytest.mark.parametrize(
    ("crashes", "delay"),
    [(0, 0.0), (1, 0.0), (2, 1.0), (3, 2.0), (4, 4.0), (5, 8.0), (7, 32.0), (8, 60.0), (20, 60.0)],
)
def test_restart_delay_doubles_from_the_second_crash_up_to_the_max(crashes: int, delay: float) -> None:
    assert restart_delay(ControllerConfig(**LADDER), crashes) == delay


def union_up(**cfg: Any) -> Log:
    log = Log(config(union=1, **{**LADDER, **cfg}))
    log.register("n1")
    log.bring_up()
    assert log.inst(1) == InstanceState.ACTIVE
    return log


def crash(log: Log, node: str = "n1") -> int:
    """The engine dies; the controller isolates and stops; the agent applies the stop."""
    dead = log.status(node, 0, EndpointStatus.DEAD, reason="process killed by SIGKILL")
    log.settle()
    log.agents(only=[node])  # the stop
    return dead


def restart_after(log: Log, node: str = "n1") -> tuple[float, Any]:
    """Let time pass until the restart is decided; (seconds waited, the start decision)."""
    waited = 0.0
    for _ in range(200):
        starts = [d for d in log.decide() if d.event.type == "command.start"]
        if starts:
            log.commit(log.decide())
            return waited, starts[0]
        log.tick(0.25)
        waited += 0.25
    raise AssertionError("no restart within 50s")


def serve(log: Log, seconds: float = 0.0) -> None:
    """The restarted engine turns READY, the instance ACTIVE; then it serves `seconds`."""
    log.agents()
    log.settle()
    assert log.inst(1) == InstanceState.ACTIVE
    if seconds:
        log.tick(seconds)


def test_crashes_in_a_row_back_off_doubling_and_the_start_counts_them() -> None:
    log = union_up()
    waits, counts = [], []
    for _ in range(4):
        crash(log)
        waited, start = restart_after(log)
        waits.append(waited)
        counts.append(start.event.data.restarts)
        serve(log, 10.0)
    assert waits == [0.0, 1.0, 2.0, 4.0]
    assert counts == [1, 2, 3, 4]


def test_the_recovery_and_its_stop_say_how_long_the_restart_backs_off() -> None:
    log = union_up()
    crash(log)
    assert "backoff" not in log.state.instances[1].reason  # the first restart does not wait
    restart_after(log)
    serve(log, 5.0)
    crash(log)
    want = "(crash 2 in a row after READY: restart after a 1s backoff)"
    assert want in log.state.instances[1].reason
    stop = log.state.nodes["n1"].stop_cmd
    assert stop is not None and want in stop.data.reason


def test_a_crash_after_serving_restart_reset_after_starts_the_count_again() -> None:
    log = union_up()
    for _ in range(3):
        crash(log)
        restart_after(log)
        serve(log, 10.0)
    serve(log, 300.0)  # then it serves long enough
    crash(log)
    waited, start = restart_after(log)
    assert (waited, start.event.data.restarts) == (0.0, 1)


def test_a_failed_start_keeps_the_count_and_does_not_wait() -> None:
    log = union_up()
    crash(log)
    restart_after(log)
    serve(log, 5.0)
    crash(log)
    _, start = restart_after(log)
    assert start.event.data.restarts == 2
    # This restart dies before READY: a start failure (attempts), not a crash after READY.
    log.agents(ready=False)
    crash(log)
    waited, again = restart_after(log)
    assert waited == 0.0
    assert (again.event.data.attempt, again.event.data.restarts) == (2, 2)


def test_the_limit_th_crash_in_a_row_fails_the_instance_over_to_a_spare() -> None:
    log = union_up(restart_limit=3)
    log.register("spare")
    for _ in range(2):
        crash(log)
        restart_after(log)
        serve(log, 10.0)
    log.status("n1", 0, EndpointStatus.DEAD, reason="process exited with code 3")
    (fault,) = log.step()
    assert fault.event.type == "fault.reported"
    d = fault.event.data
    assert (d.node_id, d.level, d.code, d.instance_id) == ("n1", FaultLevel.L5, CRASH_LOOP, 1)
    assert "crashed 3 times in a row after READY" in d.message and "failing it over" in d.message
    (iso,) = log.step()
    assert iso.event.data.state == InstanceState.ISOLATED
    assert "failing instance 1 over" in iso.event.data.reason
    assert log.types(log.step()) == ["command.stop:n1", "instance.state_changed:TERMINATED"]
    log.agents()
    (asm,) = log.step()
    assert [m.node_id for m in asm.event.data.members] == ["spare"]
    log.bring_up()
    new = asm.event.data.instance_id
    assert log.inst(new) == InstanceState.ACTIVE
    assert log.state.nodes["spare"].start_cmd.data.restarts == 0  # type: ignore[union-attr]
    # n1 sits out failover_hold, then it is a spare again.
    log.tick(299.0)
    assert log.decide() == []
    log.tick(1.0)
    assert log.types(log.step()) == ["fault.cleared:n1"]
    assert log.decide() == []


def test_failed_over_without_a_spare_comes_back_on_the_same_node_after_the_hold() -> None:
    log = union_up(restart_limit=2, failover_hold=60.0)
    crash(log)
    restart_after(log)
    serve(log, 1.0)
    crash(log)
    log.agents()
    log.settle()
    assert len(log.state.instances) == 0
    log.tick(59.0)
    assert log.decide() == []
    log.tick(1.0)
    log.bring_up()
    (inst,) = log.state.instances.values()
    assert inst.node_ids == ("n1",) and inst.state == InstanceState.ACTIVE


def test_a_registration_anew_clears_the_crash_loop_fault_at_once() -> None:
    log = union_up(restart_limit=2)
    crash(log)
    restart_after(log)
    serve(log)
    crash(log)
    log.agents()
    log.settle()
    assert any(f.data.code == CRASH_LOOP for f in log.state.faults.values())
    log.register("n1")  # an operator restarted the agent
    assert "fault.cleared:n1" in log.types(log.step())


@dataclass
class Rec:
    seq: int
    subject: str
    event: EventBase


def test_replay_verify_reproduces_backoff_restarts_and_the_failover() -> None:
    log = union_up(restart_limit=4)
    log.register("spare")
    for _ in range(3):
        crash(log)
        restart_after(log)
        serve(log, 3.0)
    crash(log)
    log.agents()
    log.bring_up()
    assert any(f.data.code == CRASH_LOOP for f in log.state.faults.values())
    records = [Rec(seq, subjects.for_event(ev), ev) for seq, ev in log.events]
    report = verify(records, lambda s, t: decide(s, log.cfg, t))
    assert report.ok, [m.render() for m in report.mismatches]
    assert report.verified > 20
