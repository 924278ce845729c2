"""decide: engine death, the fault ladder L1–L6, ScaleP2D, precision alarms, snapshots."""

from __future__ import annotations

from typing import Any

import pytest

from core.events import EndpointStatus, FaultLevel, InstanceState, Role
from tests.unit.controller_log import Log, config


def union_up(n: int = 1, **cfg: Any) -> Log:
    log = Log(config(union=1, nnodes=n, **cfg))
    for i in range(1, n + 1):
        log.register(f"n{i}")
    log.bring_up()
    assert log.inst(1) == InstanceState.ACTIVE
    return log


def test_endpoint_dead_isolates_restarts_and_comes_back_active() -> None:
    log = union_up(2)
    dead = log.status("n2", 0, EndpointStatus.DEAD, reason="exit code -9")
    (iso,) = log.step()
    assert log.types([iso]) == ["instance.state_changed:ISOLATED"]
    assert iso.event.caused_by.seq == dead  # type: ignore[union-attr]
    # Both members are stopped (a multi-node engine restarts as a whole), then started.
    assert log.types(log.step()) == [
        "instance.state_changed:RECOVERING",
        "command.stop:n1",
        "command.stop:n2",
    ]
    assert log.decide() == []  # no start before the stop is done
    log.agents(only=["n1", "n2"])
    starts = log.step()
    assert log.types(starts) == ["command.start:n1", "command.start:n2"]
    assert [d.event.data.attempt for d in starts] == [1, 1]  # type: ignore[attr-defined]
    log.agents()
    assert log.types(log.step()) == ["instance.state_changed:ACTIVE"]
    assert log.decide() == []


def test_stop_never_applied_still_restarts_after_start_timeout() -> None:
    log = union_up()
    log.status("n1", 0, EndpointStatus.DEAD)
    log.step()
    log.step()
    log.tick(29)
    assert log.decide() == []
    log.tick(1)
    assert log.types(log.decide()) == ["command.start:n1"]


def test_crash_loop_counts_attempts_then_replaces() -> None:
    log = union_up()
    for attempt in (1, 2, 3):
        log.status("n1", 0, EndpointStatus.DEAD)
        log.settle()
        log.agents(ready=False)  # stop applied
        log.settle()
        log.agents(ready=False)  # start applied, STARTING ...
        start = log.state.nodes["n1"].start_cmd
        assert start is not None and start.data.attempt == attempt  # type: ignore[union-attr]
    log.status("n1", 0, EndpointStatus.DEAD)  # ... and dies again before READY
    log.settle()
    log.agents(ready=False)
    ds = log.settle()
    assert "fault.reported:n1" in log.types(ds)
    assert "instance.state_changed:TERMINATED" in log.types(ds)


def test_abnormal_endpoint_degrades_and_ready_restores() -> None:
    log = union_up()
    log.status("n1", 0, EndpointStatus.ABNORMAL, reason="health timeout")
    assert log.types(log.step()) == ["instance.state_changed:DEGRADED"]
    assert log.decide() == []
    log.status("n1", 0, EndpointStatus.READY)
    assert log.types(log.step()) == ["instance.state_changed:ACTIVE"]


@pytest.mark.parametrize("level", ["L1", "L2"])
def test_low_level_faults_are_recorded_only(level: str) -> None:
    log = union_up()
    log.fault("n1", level, code="RetryableError")
    assert log.decide() == []
    assert log.inst(1) == InstanceState.ACTIVE


@pytest.mark.parametrize("level", ["L3", "L4"])
def test_restart_level_fault_restarts_in_place_then_clears(level: str) -> None:
    log = union_up()
    fid = log.fault("n1", level, code="EngineCoreDead", instance_id=1)
    assert log.types(log.step()) == ["instance.state_changed:ISOLATED"]
    log.step()
    log.agents()
    assert log.state.instances[1].state == InstanceState.RECOVERING
    ds = log.settle()
    log.agents()
    ds += log.settle()
    assert "command.start:n1" in log.types(ds)
    assert "instance.state_changed:ACTIVE" in log.types(ds)
    assert "fault.cleared:n1" in log.types(ds)
    assert fid not in log.state.faults
    assert log.state.instances[1].node_ids == ("n1",)  # same node


@pytest.mark.parametrize("level", ["L5", "L6"])
def test_replace_level_fault_terminates_and_reassembles_on_a_healthy_node(level: str) -> None:
    log = union_up()
    log.register("spare")
    fid = log.fault("n1", level)
    assert log.types(log.step()) == ["instance.state_changed:ISOLATED"]
    ds = log.step()
    assert log.types(ds) == ["command.stop:n1", "instance.state_changed:TERMINATED"]
    (asm,) = log.step()
    assert asm.event.data.members[0].node_id == "spare"  # type: ignore[attr-defined]
    log.bring_up()
    assert log.state.nodes["n1"].instance_id is None  # stays out while its fault is open
    log.clear_fault(fid)
    assert log.decide() == []  # capacity met; n1 is a spare again
    assert fid not in log.state.faults


def test_fault_on_a_free_node_blocks_assembly_until_cleared() -> None:
    log = Log(config(union=1))
    log.register("n1")
    fid = log.fault("n1", FaultLevel.L6, code="NodeReboot")
    assert log.decide() == []
    log.clear_fault(fid)
    assert log.types(log.decide()) == ["instance.assembled"]


def test_restart_level_fault_on_a_free_node_is_cleared() -> None:
    log = Log(config(union=1))
    log.register("n1")
    log.fault("n1", FaultLevel.L3)
    log.register("x", engine_type="vllm")  # keeps n1 the only builtin node
    types = log.types(log.decide())
    assert "fault.cleared:n1" in types


def test_member_deregistered_replaces_the_instance() -> None:
    log = union_up(2)
    log.register("spare")
    log.deregister("n2")
    ds = log.settle()
    assert log.types(ds) == [
        "instance.state_changed:ISOLATED",
        "command.stop:n1",
        "instance.state_changed:TERMINATED",
    ]
    log.agents()  # n1 applies its stop: only then is it free for the next instance
    (asm,) = log.step()
    assert [m.node_id for m in asm.event.data.members] == ["n1", "spare"]  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- ScaleP2D


def p2d(scale: bool) -> Log:
    log = Log(config(prefill=2, decode=1, scale_p2d=scale))
    log.register("p1", Role.PREFILL)
    log.register("p2", Role.PREFILL)
    log.register("d1", Role.DECODE)
    log.bring_up()
    return log


def test_scale_p2d_rebuilds_decode_from_a_prefill_instance_and_gives_it_back() -> None:
    log = p2d(True)
    d_id = next(i for i, r in log.state.instances.items() if r.spec.role == Role.DECODE)
    fid = log.fault("d1", FaultLevel.L5)
    log.settle()
    assert d_id not in log.state.instances
    # The newest prefill instance was taken apart; its node becomes the decode.
    log.agents()
    log.settle()
    decode = [r for r in log.state.instances.values() if r.spec.role == Role.DECODE]
    assert len(decode) == 1 and decode[0].node_ids == ("p2",)
    assert sum(r.spec.role == Role.PREFILL for r in log.state.instances.values()) == 1
    log.bring_up()
    assert decode[0].instance_id in log.state.instances
    assert log.state.instances[decode[0].instance_id].state == InstanceState.ACTIVE
    # The hardware is fixed: a decode is rebuilt on d1, then p2 goes back to prefill.
    log.clear_fault(fid)
    log.bring_up()
    roles = sorted((r.spec.role.value, r.node_ids) for r in log.state.instances.values())
    assert roles == [("decode", ("d1",)), ("prefill", ("p1",)), ("prefill", ("p2",))]


def test_without_scale_p2d_a_lost_decode_waits_for_a_decode_node() -> None:
    log = p2d(False)
    log.fault("d1", FaultLevel.L5)
    log.settle()
    log.agents()
    assert log.settle() == []
    assert sum(r.spec.role == Role.PREFILL for r in log.state.instances.values()) == 2
    assert not any(r.spec.role == Role.DECODE for r in log.state.instances.values())


def test_scale_p2d_keeps_the_last_prefill_instance() -> None:
    log = Log(config(prefill=1, decode=1, scale_p2d=True))
    log.register("p1", Role.PREFILL)
    log.register("d1", Role.DECODE)
    log.bring_up()
    log.fault("d1", FaultLevel.L6)
    log.settle()
    log.agents()
    assert log.settle() == []
    assert [r.spec.role for r in log.state.instances.values()] == [Role.PREFILL]


# --------------------------------------------------------------------------- precision alarm


def pd_up() -> tuple[Log, int, int]:
    log = Log(config(prefill=1, decode=1))
    log.register("p1", Role.PREFILL)
    log.register("d1", Role.DECODE)
    log.bring_up()
    ids = {r.spec.role: i for i, r in log.state.instances.items()}
    return log, ids[Role.DECODE], ids[Role.PREFILL]


def test_precision_alarm_isolates_the_pd_group_restarts_and_clears() -> None:
    log, d, p = pd_up()
    seq = log.alarm(d, p)
    iso = log.step()
    assert sorted(log.types(iso)) == ["instance.state_changed:ISOLATED"] * 2
    assert all(x.event.caused_by.seq == seq for x in iso)  # type: ignore[union-attr]
    assert {log.inst(d), log.inst(p)} == {InstanceState.ISOLATED}
    log.step()
    assert log.decide() == []  # stops sent, not applied: the old READY must not count
    log.agents()
    log.step()  # starts
    assert d in log.state.alarms  # not cleared before the group is READY again
    log.agents()
    ds = log.step()
    assert sorted(log.types(ds)) == [
        "instance.state_changed:ACTIVE",
        "instance.state_changed:ACTIVE",
        "precision.alarm_cleared",
    ]
    assert d not in log.state.alarms
    assert log.decide() == []


def test_precision_alarm_for_a_missing_decode_is_cleared() -> None:
    log, _, _ = pd_up()
    log.alarm(99)
    assert log.types(log.decide()) == ["precision.alarm_cleared"]


# --------------------------------------------------------------------------- snapshot


def test_snapshot_pending_is_not_active_and_restore_keeps_the_instance_id() -> None:
    log = union_up()
    log.snapshot("n1", "suspended")
    assert log.types(log.step()) == ["instance.state_changed:INACTIVE"]
    log.tick(120, heartbeats=False)  # heartbeats are gated while the checkpoint runs
    assert log.decide() == []
    log.snapshot("n1", "restored")
    log.register("n1", ip="10.9.9.9", job_name="job-2", instance_id=1, running_endpoints=(0,), restored=True)
    (asm,) = log.step()
    assert asm.event.type == "instance.assembled"
    data: Any = asm.event.data
    assert (data.instance_id, data.master_dp_ip, data.job_name) == (1, "10.9.9.9", "job-2")
    (start,) = log.step()
    assert (start.event.data.instance_id, start.event.data.master_dp_ip) == (1, "10.9.9.9")  # type: ignore[attr-defined]
    log.agents()
    assert log.types(log.step()) == ["instance.state_changed:ACTIVE"]
    assert log.decide() == []
