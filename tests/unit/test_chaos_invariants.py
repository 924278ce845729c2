"""The chaos suite's invariant checks (tests/chaos/invariants.py) on hand-made recordings."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chaos import invariants as inv
from tests.chaos.faults import MUST_SKIP, POISON_KINDS, poison_messages
from tests.chaos.invariants import Entry, Proc
from tests.chaos.load import Outcome

REFS = {"a": "one two three", "b": "four five"}


def ok(spec: str = "a", *, t: float = 10.0, stream: bool = True, text: str | None = None) -> Outcome:
    return Outcome(spec, 0, stream, t, t + 1, 200, "", REFS[spec] if text is None else text, True)


def failed(status: int | None, error: str, *, t: float = 10.0) -> Outcome:
    return Outcome("a", 1, True, t, t + 0.1, status, error)


# --------------------------------------------------------------------------- 1


def test_clients_all_fine() -> None:
    c = inv.client_outcomes([ok(), ok("b", stream=False)], REFS)
    assert c.ok and "2 requests (1 streams) all succeeded" in c.detail


def test_clients_nothing_recorded_fails() -> None:
    assert not inv.client_outcomes([], REFS).ok


@pytest.mark.parametrize(
    ("outcome", "says"),
    [
        (failed(503, "no routable prefill/decode pair for model 'motor-sim'"), "HTTP 503: no routable"),
        (failed(None, "error in stream: no routable prefill/decode pair left"), "error in stream"),
        (failed(None, "connection: RemoteProtocolError"), "connection"),
        (Outcome("a", 0, True, 10, 11, 200, "", "one two", False), "without a finish_reason"),
    ],
)
def test_clients_any_failure_fails_and_is_named(outcome: Outcome, says: str) -> None:
    c = inv.client_outcomes([ok(), outcome], REFS, origin=9.0)
    assert not c.ok and "1 of 2 failed" in c.detail and says in c.detail
    assert "+1.0 s" in c.detail  # relative to the fault


def test_clients_text_must_equal_the_undisturbed_run() -> None:
    c = inv.client_outcomes([ok(), ok(text="one two three four")], REFS)
    assert not c.ok and "differs from the undisturbed run" in c.detail


def test_clients_retry_allowed_only_for_a_dead_replica_window() -> None:
    retried = ok(t=20.0)
    retried.retried, retried.first_error, retried.first_error_connection = True, "connection: reset", True
    assert inv.client_outcomes([retried], REFS, reconnect_until=21.0).ok
    late = inv.client_outcomes([retried], REFS, reconnect_until=19.0)
    assert not late.ok and "client retry" in late.detail
    assert not inv.client_outcomes([retried], REFS).ok  # no replica died at all


def test_clients_stuck_after_the_hang_left_routing() -> None:
    slow = Outcome("a", 0, True, 30.0, 36.0, 200, "", REFS["a"], True)
    early_slow = Outcome("a", 0, True, 10.0, 16.0, 200, "", REFS["a"], True)
    assert inv.client_outcomes([early_slow, ok(t=31.0)], REFS, stuck_after=20.0, stuck_limit=4.0).ok
    c = inv.client_outcomes([slow], REFS, stuck_after=20.0, stuck_limit=4.0)
    assert not c.ok and "still took > 4 s" in c.detail


def test_fault_hit() -> None:
    assert inv.fault_hit(2, "decode").ok
    assert not inv.fault_hit(0, "union").ok


# --------------------------------------------------------------------------- 2


@pytest.mark.parametrize(
    ("recovered", "good", "says"),
    [
        ({"d": (10.0, 11.5)}, True, "served 1.5 s after READY"),
        ({"d": (10.0, 25.0)}, False, "served 15.0 s after READY"),
        ({"d": (10.0, None)}, False, "no request reached it"),
        ({"d": (None, None)}, False, "never reported READY"),
        ({"u": (10.0, 12.0), "d": (10.0, None)}, False, "d READY again"),
    ],
)
def test_routing_resumed(
    recovered: dict[str, tuple[float | None, float | None]], good: bool, says: str
) -> None:
    c = inv.routing_resumed(recovered, 10.0)
    assert c.ok is good and says in c.detail


# --------------------------------------------------------------------------- 3


def test_processes() -> None:
    fine = {"controller-c1": Proc(True, 1, True), "coordinator": Proc(True, 0)}
    assert inv.processes(fine, killed=["controller-c1"]).ok
    dead = inv.processes({"coordinator": Proc(False, 0)})
    assert not dead.ok and "not running" in dead.detail
    crashed = inv.processes({"controller-c2": Proc(True, 2, True)}, nats_trouble=True)
    assert not crashed.ok and "exited on NATS trouble: restarted 2×" in crashed.detail
    not_back = inv.processes({"nodeagent-decode-0": Proc(True, 0)}, killed=["nodeagent-decode-0"])
    assert not not_back.ok and "not restarted" in not_back.detail


# --------------------------------------------------------------------------- 4, 6, 7


def changed(seq: int, iid: int, state: str, ts: float) -> Entry:
    return Entry(
        seq, f"motor.evt.instance.{iid}", "instance.state_changed", ts, {"instance_id": iid, "state": state}
    )


def test_nothing_judged_by_outage() -> None:
    before = changed(5, 1, "INACTIVE", 99.0)  # before the outage: not its fault
    assert inv.nothing_judged_by_outage([before, changed(6, 1, "ACTIVE", 101.0)], 100.0).ok
    c = inv.nothing_judged_by_outage([changed(7, 2, "TERMINATED", 130.0)], 100.0)
    assert not c.ok and "instance 2 TERMINATED at seq 7" in c.detail


def test_nobody_judged_by_a_clock_reads_every_entry_whatever_its_ts() -> None:
    # A controller an hour behind stamps its decisions an hour back: still judged.
    stepped_back = changed(8, 1, "INACTIVE", 100.0 - 3600.0)
    assert inv.nobody_judged_by_a_clock([changed(6, 1, "ACTIVE", 101.0)]).ok
    c = inv.nobody_judged_by_a_clock([changed(6, 1, "ACTIVE", 101.0), stepped_back])
    assert not c.ok and "instance 1 INACTIVE at seq 8" in c.detail
    stop = Entry(
        9, "motor.cmd.union-0.stop", "command.stop", 0.0, {"instance_id": 1, "reason": "heartbeat lost"}
    )
    c = inv.nobody_judged_by_a_clock([stop])
    assert not c.ok and "command.stop at seq 9 (heartbeat lost)" in c.detail


def start(seq: int, node: str = "decode-0", iid: int = 2, attempt: int = 1) -> Entry:
    data = {"instance_id": iid, "node_id": node, "attempt": attempt}
    return Entry(seq, f"motor.cmd.{node}.start", "command.start", float(seq), data)


def status(seq: int, node: str = "decode-0") -> Entry:
    return Entry(seq, f"motor.evt.endpoint.{node}", "endpoint.status_changed", float(seq), {"node_id": node})


@pytest.mark.parametrize(
    ("entries", "good"),
    [
        ([start(1), status(2), start(3)], True),  # a restart after the engine died
        ([start(1), start(2, attempt=2)], True),  # a resend after start_timeout
        ([start(1), start(2, node="prefill-0", iid=3)], True),
        ([start(1), status(2, node="union-0"), start(3)], False),  # nothing about decode-0 between
        ([start(1), start(2)], False),  # a deposed leader's late repeat
    ],
)
def test_one_start_per_incarnation(entries: list[Entry], good: bool) -> None:
    assert inv.one_start_per_incarnation(entries).ok is good


def test_engines_kept() -> None:
    stop = Entry(9, "motor.cmd.union-0.stop", "command.stop", 120.0, {"node_id": "union-0"})
    assert inv.engines_kept({9000: 11, 9010: 12}, {9000: 11, 9010: 12}, [], 100.0).ok
    c = inv.engines_kept({9000: 11, 9010: 12}, {9000: 11, 9010: 13}, [stop], 100.0)
    assert not c.ok and "port(s) 9010" in c.detail and "1 stop command" in c.detail


# --------------------------------------------------------------------------- 5


METRICS = """# HELP motor_controller_events_skipped_total Events skipped
# TYPE motor_controller_events_skipped_total counter
motor_controller_events_skipped_total{reason="undecodable",stream="MOTOR"} 2.0
motor_controller_events_skipped_total{reason="inapplicable",stream="MOTOR"} 1.0
motor_coordinator_events_skipped_total{reason="unknown_type"} 3.0
motor_controller_events_skipped{stream="MOTOR"} 9.0
motor_coordinator_requests_total{route="chat"} 5.0
"""


def test_skipped_counts_read_every_reason() -> None:
    assert inv.skipped_counts(METRICS) == {
        ("motor_controller", "undecodable"): 2.0,
        ("motor_controller", "inapplicable"): 1.0,
        ("motor_coordinator", "unknown_type"): 3.0,
    }
    assert inv.skipped_counts("") == {}


def test_poison_handled() -> None:
    every = {"controller-c1": True, "coordinator": True}
    assert inv.poison_handled(
        "unknown type",
        skipped_delta={"controller-c1": 1, "coordinator": 1},
        must_skip=True,
        folded_past=every,
    ).ok
    uncounted = inv.poison_handled(
        "unknown type",
        skipped_delta={"controller-c1": 1, "coordinator": 0},
        must_skip=True,
        folded_past=every,
    )
    assert not uncounted.ok and "not counted" in uncounted.detail and "coordinator" in uncounted.detail
    stalled = inv.poison_handled(
        "x", skipped_delta={}, must_skip=False, folded_past={"controller-c1": False, "coordinator": True}
    )
    assert not stalled.ok and "stopped folding at the x: controller-c1" in stalled.detail


@pytest.mark.parametrize("kind", POISON_KINDS)
def test_every_poison_kind_has_messages(kind: str) -> None:
    msgs = poison_messages(kind, "union-0", "t1")
    assert msgs and all(subject.startswith("motor.") for subject, _, _ in msgs)
    if kind == "non-finite ts":
        assert b'"ts":1e999' in msgs[0][1]
    if kind == "duplicate Nats-Msg-Id":
        assert len(msgs) == 2 and msgs[0] == msgs[1]
    assert set(POISON_KINDS) >= MUST_SKIP


# --------------------------------------------------------------------------- 8, 9, 10


def test_reconverged_and_failover() -> None:
    assert inv.reconverged(12.0, 30.0, "all ACTIVE").ok
    assert not inv.reconverged(31.0, 30.0, "all ACTIVE").ok
    missing = inv.reconverged(None, 30.0, "all ACTIVE", "no request reached union engine")
    assert not missing.ok and "no request reached union engine" in missing.detail
    assert inv.failover(100.0, 102.5, 3.0, "c2").ok
    late = inv.failover(100.0, 104.7, 3.0, "c2")
    assert not late.ok and "4.7 s" in late.detail
    assert not inv.failover(100.0, None, 3.0, "c2").ok


def test_latency_bound_counts_from_the_first_attempt() -> None:
    fast = [ok(t=float(i)) for i in range(99)]
    c = inv.latency_bound(fast, 5.0)
    assert c.ok and "99 requests within 5 s: p50 1.00 s, p99 1.00 s, max 1.00 s" in c.detail
    hung = Outcome("a", 2, True, 10.0, 16.5, 200, "", REFS["a"], True, retried=True)
    c = inv.latency_bound([*fast, hung], 5.0)
    assert not c.ok and "1 of 100 took over 5 s" in c.detail and "1 retried after a reset" in c.detail
    assert not inv.latency_bound([], 5.0).ok


def test_replica_replaced() -> None:
    good: dict[str, Any] = {
        "frozen_at": 100.0,
        "killed_at": 102.8,
        "within": 3.0,
        "pid_before": 10,
        "pid_after": 11,
        "served_after": 40.0,
        "restarts": 1,
        "continued": False,
    }
    c = inv.replica_replaced(**good)
    assert c.ok and "killed 2.8 s after it froze" in c.detail
    changes: list[tuple[dict[str, Any], str]] = [
        ({"killed_at": None}, "never taken out"),
        ({"killed_at": 104.0}, "killed only 4.0 s"),
        ({"pid_after": 10}, "no new process"),
        ({"pid_after": None}, "no new process"),
        ({"served_after": 0.0}, "served no request"),
        ({"restarts": 2}, "restarted 2×"),
        ({"continued": True}, "still there for the SIGCONT"),
    ]
    for change, says in changes:
        c = inv.replica_replaced(**{**good, **change})
        assert not c.ok and says in c.detail, change


def test_explained() -> None:
    circuit = Entry(40, "motor.evt.circuit.decode-0", "coordinator.circuit_changed", 105.0, {})
    old = Entry(30, "motor.evt.circuit.decode-0", "coordinator.circuit_changed", 95.0, {})
    text = "coordinator.circuit_changed decode-0/0 open"
    assert inv.explained([circuit], 100.0, text).ok
    assert not inv.explained([old], 100.0, text).ok  # before the fault: explains something else
    nothing = inv.explained([circuit], 100.0, "endpoint.status_changed DEAD")
    assert not nothing.ok and "--explain" in nothing.detail
    named = Entry(
        41,
        "motor.evt.streams.decode-0",
        "coordinator.streams_disrupted",
        106.0,
        {"coordinator": "coordinator-2"},
    )
    said = "decode-0/0 via coordinator-2 over 1.0 s: 3 streams broke: 3 continued"
    assert inv.explained([named], 100.0, said).ok
    assert not inv.explained([named], 100.0, "decode-0/0 DEAD").ok


def test_report_lists_every_check() -> None:
    text = inv.report("t", [inv.Check("1 a", True, "fine"), inv.Check("2 b", False, "broken")])
    assert "PASS  1 a" in text and "FAIL  2 b" in text and text.startswith("== chaos: t")
