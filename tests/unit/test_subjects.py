import pytest

from core import subjects
from core.errors import SubjectError
from core.events import (
    FaultReported,
    FaultReportedData,
    Heartbeat,
    HeartbeatData,
    InstanceStateChanged,
    InstanceStateChangedData,
    StartCommand,
)
from tests import placed
from tests.unit.factories import start_cmd


@pytest.mark.parametrize(
    ("subject", "family", "kind", "entity"),
    [
        ("motor.evt.node.n7", "evt", "node", "n7"),
        ("motor.evt.instance.3", "evt", "instance", "3"),
        ("motor.cmd.n7.start", "cmd", "start", "n7"),
        ("motor.hb.node-1", "hb", "hb", "node-1"),
    ],
)
def test_parse(subject: str, family: str, kind: str, entity: str) -> None:
    p = subjects.parse(subject)
    assert (p.family, p.kind, p.entity) == (family, kind, entity)


@pytest.mark.parametrize(
    "bad", ["nats.evt.node.n7", "motor.evt.node", "motor.cmd.n7", "motor.hb.a.b", "motor"]
)
def test_parse_rejects(bad: str) -> None:
    with pytest.raises(SubjectError):
        subjects.parse(bad)


@pytest.mark.parametrize("token", ["a.b", "a b", "*", ">", ""])
def test_bad_tokens(token: str) -> None:
    with pytest.raises(SubjectError):
        subjects.event("node", token)


def test_format_roundtrip() -> None:
    assert placed.node("n7") == "motor.evt.node.n7"
    assert placed.instance(3) == "motor.evt.instance.3"
    assert placed.command("n7", "stop") == "motor.cmd.n7.stop"
    assert subjects.node_commands("n7") == "motor.cmd.n7.>"
    assert subjects.heartbeat("n7") == "motor.hb.n7"


def test_for_event() -> None:
    hb = Heartbeat(id="1", ts=1, source="t", data=HeartbeatData(node_id="n1"))
    assert subjects.for_event(hb) == "motor.hb.n1"
    f = FaultReported(
        id="2", ts=1, source="t", data=FaultReportedData(fault_id="f", node_id="n2", level="L3", code="X")
    )
    assert subjects.for_event(f) == "motor.evt.fault.n2"
    sc = InstanceStateChanged(
        id="3", ts=1, source="t", data=InstanceStateChangedData(instance_id=4, state="ACTIVE")
    )
    assert subjects.for_event(sc) == "motor.evt.instance.4"
    cmd: StartCommand = start_cmd("n9", 1)
    assert subjects.for_event(cmd) == "motor.cmd.n9.start"
