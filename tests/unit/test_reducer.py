"""Table tests for `apply`: each event type and each transition it drives."""

from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as hst

from core.codec import decode
from core.events import (
    CommandApplied,
    CommandAppliedData,
    CommandRefused,
    CommandRefusedData,
    EndpointLoad,
    EndpointStatus,
    FaultCleared,
    FaultClearedData,
    FaultReported,
    FaultReportedData,
    Heartbeat,
    HeartbeatData,
    InstancesRefreshed,
    InstancesRefreshedData,
    InstanceState,
    InstanceStateChanged,
    InstanceStateChangedData,
    LeaderChanged,
    LeaderChangedData,
    NodeDeregistered,
    NodeDeregisteredData,
    PrecisionAlarmCleared,
    PrecisionAlarmClearedData,
    PrecisionAlarmRaised,
    PrecisionAlarmRaisedData,
    SnapshotCheckpoint,
    SnapshotCheckpointData,
    StopCommand,
    StopCommandData,
)
from core.reducer import apply, fold
from core.state import ClusterState, state_from_dict, state_to_dict
from tests.unit.factories import assembled, ep_status, registered, start_cmd


def base() -> ClusterState:
    return fold([(1, registered("n1")), (2, registered("n2", ts=1.5)), (3, assembled(1, ["n1", "n2"]))])


def test_registration_order_and_reregistration_keeps_order() -> None:
    s = base()
    assert [s.nodes["n1"].order, s.nodes["n2"].order] == [0, 1]
    s2 = apply(s, registered("n1", ts=9.0, ip="10.0.0.9"), 10)
    assert s2.nodes["n1"].order == 0
    assert s2.nodes["n1"].reg.pod_ip == "10.0.0.9"
    assert s2.nodes["n1"].instance_id == 1  # still a member of instance 1
    assert s2.next_order == 2


def test_apply_is_pure() -> None:
    s = base()
    before = state_to_dict(s)
    apply(s, ep_status("n1", "READY"), 4)
    assert state_to_dict(s) == before


def test_assembled_marks_members() -> None:
    s = base()
    assert s.instances[1].state == InstanceState.INITIAL
    assert s.nodes["n1"].instance_id == 1 and s.nodes["n2"].instance_id == 1
    assert s.next_instance_id == 2
    assert s.last_seq == 3


def test_start_then_applied_then_refused_is_ignored_for_other_ids() -> None:
    cmd = start_cmd("n1", 1)
    s = apply(base(), cmd, 4)
    assert s.nodes["n1"].start_cmd is not None and s.nodes["n1"].start_cmd.status == "pending"
    ok = CommandApplied(
        id="a",
        ts=5,
        source="x",
        data=CommandAppliedData(command_id=cmd.data.command_id, node_id="n1", verb="start"),
    )
    s = apply(s, ok, 5)
    assert s.nodes["n1"].start_cmd.status == "applied"  # type: ignore[union-attr]
    other = CommandRefused(
        id="b",
        ts=6,
        source="x",
        data=CommandRefusedData(
            command_id="zzz", node_id="n1", verb="start", code="job_mismatch", reason="r"
        ),
    )
    assert apply(s, other, 6).nodes["n1"].start_cmd.status == "applied"  # type: ignore[union-attr]


def test_refused() -> None:
    cmd = start_cmd("n1", 1)
    s = apply(base(), cmd, 4)
    bad = CommandRefused(
        id="b",
        ts=6,
        source="x",
        data=CommandRefusedData(
            command_id=cmd.data.command_id, node_id="n1", verb="start", code="port_in_use", reason="9000 busy"
        ),
    )
    rec = apply(s, bad, 5).nodes["n1"].start_cmd
    assert rec is not None and rec.status == "refused" and "port_in_use" in rec.reason


def test_stop_applied_marks_endpoints_stopped() -> None:
    s = apply(base(), ep_status("n1", "READY"), 4)
    stop = StopCommand(id="s", ts=5, source="c", data=StopCommandData(command_id="s", node_id="n1"))
    s = apply(s, stop, 5)
    done = CommandApplied(
        id="d", ts=6, source="n", data=CommandAppliedData(command_id="s", node_id="n1", verb="stop")
    )
    s = apply(s, done, 6)
    assert s.nodes["n1"].endpoint_status[0] == EndpointStatus.STOPPED


def test_endpoint_status_and_all_ready() -> None:
    s = apply(base(), ep_status("n1", "STARTING"), 4)
    assert not s.nodes["n1"].all_ready()
    s = apply(s, ep_status("n1", "READY", ts=5), 5)
    assert s.nodes["n1"].all_ready()
    s = apply(s, ep_status("n1", "DEAD", ts=6), 6)
    assert s.nodes["n1"].endpoint_status[0] == EndpointStatus.DEAD


def test_heartbeat_updates_liveness_and_load_but_not_seq() -> None:
    hb = Heartbeat(
        id="h",
        ts=7.5,
        source="n",
        data=HeartbeatData(node_id="n1", endpoints=(EndpointLoad(id=0, status="READY", running=3),)),
    )
    s = apply(base(), hb)
    assert s.nodes["n1"].last_hb_ts == 7.5
    assert s.nodes["n1"].load[0].running == 3
    assert s.last_seq == 3
    unknown = Heartbeat(id="h2", ts=8, source="n", data=HeartbeatData(node_id="ghost"))
    assert "ghost" not in apply(s, unknown).nodes


def test_state_changes_and_termination_frees_nodes() -> None:
    s = base()
    for st in ["ACTIVE", "INACTIVE", "ISOLATED", "RECOVERING", "ACTIVE"]:
        s = apply(
            s,
            InstanceStateChanged(
                id=st, ts=5, source="c", data=InstanceStateChangedData(instance_id=1, state=st)
            ),
            5,
        )
        assert s.instances[1].state == InstanceState(st)
    s = apply(
        s,
        InstanceStateChanged(
            id="t", ts=6, source="c", data=InstanceStateChangedData(instance_id=1, state="TERMINATED")
        ),
        6,
    )
    assert 1 not in s.instances
    assert s.nodes["n1"].instance_id is None and s.nodes["n2"].instance_id is None


def test_faults_open_and_clear() -> None:
    f = FaultReported(
        id="f",
        ts=5,
        source="op",
        data=FaultReportedData(fault_id="f1", node_id="n2", level="L5", code="CardUnhealthy"),
    )
    s = apply(base(), f, 4)
    assert [x.data.code for x in s.instance_faults(1)] == ["CardUnhealthy"]
    s = apply(
        s, FaultCleared(id="c", ts=6, source="op", data=FaultClearedData(fault_id="f1", node_id="n2")), 5
    )
    assert not s.faults


def test_precision_alarm_raise_clear() -> None:
    r = PrecisionAlarmRaised(
        id="p", ts=5, source="coord", data=PrecisionAlarmRaisedData(alarm_id="a", d_instance_id=1)
    )
    s = apply(base(), r, 4)
    assert 1 in s.alarms
    s = apply(
        s, PrecisionAlarmCleared(id="q", ts=6, source="c", data=PrecisionAlarmClearedData(d_instance_id=1)), 5
    )
    assert 1 not in s.alarms


def test_snapshot_phases_pending() -> None:
    s = base()
    for phase, pending in [
        ("metadata_prepared", False),
        ("suspended", True),
        ("checkpoint_done", True),
        ("restored", False),
    ]:
        s = apply(
            s,
            SnapshotCheckpoint(
                id=phase,
                ts=5,
                source="n",
                data=SnapshotCheckpointData(node_id="n1", phase=phase, instance_id=1),
            ),
            5,
        )
        assert s.snapshot_pending(1) is pending


def test_deregistered() -> None:
    s = apply(base(), NodeDeregistered(id="d", ts=5, source="n", data=NodeDeregisteredData(node_id="n2")), 4)
    assert "n2" not in s.nodes


def test_leader_and_refresh() -> None:
    s = apply(
        base(),
        LeaderChanged(
            id="l", ts=5, source="c", data=LeaderChangedData(leader_id="c2", previous="c1", term=2)
        ),
        4,
    )
    assert s.leader is not None and s.leader.leader_id == "c2"
    inst = {"id": 7, "ip": "1.2.3.4", "port": "2000"}
    s = apply(
        s,
        InstancesRefreshed(
            id="r", ts=6, source="co", data=InstancesRefreshedData(event="add", ids=(7,), instances=(inst,))
        ),
        5,
    )
    assert s.external[7]["ip"] == "1.2.3.4"
    s = apply(
        s,
        InstancesRefreshed(
            id="r2", ts=7, source="co", data=InstancesRefreshedData(event="del", ids=(7,), instances=())
        ),
        6,
    )
    assert 7 not in s.external


def test_state_dict_roundtrip() -> None:
    s = apply(base(), start_cmd("n1", 1), 4)
    s = apply(s, ep_status("n1", "READY"), 5)
    again = state_from_dict(state_to_dict(s))
    assert state_to_dict(again) == state_to_dict(s)
    assert again == s


@pytest.mark.parametrize(
    "entries",
    [
        ({"ip": "1.2.3.4", "port": 2000},),  # no id at all: the poison event of issue 11
        ({"id": None},),
        ({"id": "seven"},),
        ({"id": True},),
        ({"id": [7]},),
        ({"id": {"n": 7}},),
        ({"id": 1.5},),
    ],
)
@pytest.mark.parametrize("verb", ["set", "add"])
def test_refresh_entries_without_a_usable_id_are_ignored(
    entries: tuple[dict[str, Any], ...], verb: str
) -> None:
    good = {"id": 8, "ip": "1.2.3.5", "port": 2001}
    data = InstancesRefreshedData.model_validate({"event": verb, "ids": [8], "instances": [*entries, good]})
    s = apply(base(), InstancesRefreshed(id="r", ts=6, source="rogue", data=data), 5)
    assert dict(s.external) == {8: good} and s.last_seq == 5


def test_refresh_ids_given_as_digit_strings_still_count() -> None:
    data = InstancesRefreshedData(event="set", ids=(7,), instances=({"id": "7", "ip": "1.2.3.4"},))
    s = apply(base(), InstancesRefreshed(id="r", ts=6, source="co", data=data), 5)
    assert list(s.external) == [7]


_JSON = hst.recursive(
    hst.none()
    | hst.booleans()
    | hst.integers(-(2**63), 2**63 - 1)
    | hst.floats(allow_nan=False, allow_infinity=False)
    | hst.text(max_size=5),
    lambda inner: hst.lists(inner, max_size=3) | hst.dictionaries(hst.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=200, deadline=None)
@example(verb="set", entries=[{"id": "¹"}])  # a digit to isdigit(), not to int(): found by this test
@given(
    verb=hst.sampled_from(["set", "add", "del"]),
    entries=hst.lists(
        hst.dictionaries(hst.sampled_from(["id", "ip", "port", "x"]), _JSON, max_size=4), max_size=4
    ),
)
def test_apply_never_raises_on_any_decodable_refresh(verb: str, entries: list[dict[str, Any]]) -> None:
    raw = {"id": "r", "type": "instances.refreshed", "ts": 6, "source": "any", "data": {}}
    raw["data"] = {"event": verb, "ids": [], "instances": entries}
    ev = decode(orjson.dumps(raw))
    s = apply(base(), ev, 5)
    assert s.last_seq == 5


def test_events_about_unknown_entities_are_no_ops() -> None:
    """Decodable events a rogue or stale producer may write about things the log never had."""
    s0 = base()
    unknown = [
        CommandApplied(
            id="a", ts=9, source="x", data=CommandAppliedData(command_id="c?", node_id="n9", verb="stop")
        ),
        CommandApplied(
            id="b", ts=9, source="x", data=CommandAppliedData(command_id="c?", node_id="n1", verb="stop")
        ),
        InstanceStateChanged(
            id="c",
            ts=9,
            source="x",
            data=InstanceStateChangedData(instance_id=99, state=InstanceState.TERMINATED),
        ),
        PrecisionAlarmCleared(id="d", ts=9, source="x", data=PrecisionAlarmClearedData(d_instance_id=99)),
        FaultCleared(id="e", ts=9, source="x", data=FaultClearedData(fault_id="f?", node_id="n9")),
        start_cmd("n9", 5),
        ep_status("n9", "READY"),
        assembled(7, ["n9"]),
    ]
    s = s0
    for i, ev in enumerate(unknown, 10):
        s = apply(s, ev, i)
    assert s.nodes == s0.nodes
