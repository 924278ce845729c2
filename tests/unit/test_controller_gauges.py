"""The controller's instance and fault gauges are counted from the fold's state on every tick,
but rebuilt only when the instances or the faults changed: a heartbeat moves neither, and the
rebuild was most of what a tick's metrics cost (tests/sim)."""

from __future__ import annotations

from controller.service import ControllerService
from core.configfile import parse_config
from core.events import Heartbeat, HeartbeatData
from core.reducer import apply
from tests.unit.factories import assembled, registered


def gauge(svc: ControllerService, name: str, **labels: str) -> float | None:
    return svc.metrics.registry.get_sample_value(name, labels)


def test_instance_gauges_follow_the_instances_and_skip_what_did_not_change() -> None:
    svc = ControllerService(parse_config("union: {instances: 1}"), controller_id="c1")
    svc.fold.state = apply(apply(svc.fold.state, registered("n1")), assembled(1, ["n1"]))
    svc._observe()
    assert gauge(svc, "motor_controller_instances", role="union", state="INITIAL") == 1.0

    rebuilt = []
    clear = svc.metrics.instances.clear
    svc.metrics.instances.clear = lambda: (rebuilt.append(1), clear())[1]  # type: ignore[method-assign]
    hb = Heartbeat(id="hb1", ts=5.0, source="nodeagent/n1", data=HeartbeatData(node_id="n1"))
    svc.fold.state = apply(svc.fold.state, hb)
    svc._observe()
    assert rebuilt == []  # a heartbeat changed nodes only
    assert gauge(svc, "motor_controller_instances", role="union", state="INITIAL") == 1.0

    svc.fold.state = apply(svc.fold.state, assembled(2, ["n1"], ts=6.0))
    svc._observe()
    assert rebuilt == [1]
    assert gauge(svc, "motor_controller_instances", role="union", state="INITIAL") == 2.0
