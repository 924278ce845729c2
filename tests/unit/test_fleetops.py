"""Issue 21 item 2: fleet operations and LoRA adapters through the log — the fold, the
controller's commands and summary, the coordinator's view, the route table, the CLI's progress."""

from __future__ import annotations

from typing import Any

import pytest

from coordinator.derive import derive
from coordinator.losshold import LossHold
from core.events import (
    EngineOpCommand,
    EngineOpCompleted,
    EngineOpCompletedData,
    EngineOpResult,
    FleetOpArgs,
    FleetOpRequested,
    FleetOpRequestedData,
)
from core.fleetopsstate import ASLEEP, PAUSED, adapters_of, mode_of
from core.state import state_from_dict, state_to_dict
from deploy.cmd_fleet import fleet_progress
from nodeagent.engine_ops import ROUTES, route_for
from tests.unit.controller_log import Log, config


def up(union: int = 2, nodes: int = 2) -> Log:
    log = Log(config(union=union))
    log.lead(1)
    for i in range(nodes):
        log.register(f"n{i + 1}")
    log.bring_up()
    return log


def request(log: Log, op: str, model: str = "motor-sim", **args: Any) -> str:
    oid = log._id("op")
    data = FleetOpRequestedData(op_id=oid, op=op, model=model, args=FleetOpArgs(**args))  # type: ignore[arg-type]
    log.add(FleetOpRequested(id=oid, ts=log.now, source="operator", data=data))
    return oid


def answer(log: Log, cmd: EngineOpCommand, *outcomes: str) -> int:
    d = cmd.data
    results = tuple(EngineOpResult(endpoint_id=i, outcome=o) for i, o in enumerate(outcomes or ("ok",)))  # type: ignore[arg-type]
    data = EngineOpCompletedData(
        command_id=d.command_id, op_id=d.op_id, node_id=d.node_id, instance_id=d.instance_id,
        op=d.op, args=d.args, results=results,
    )  # fmt: skip
    return log.add(
        EngineOpCompleted(id=log._id("res"), ts=log.now, source=f"nodeagent/{d.node_id}", data=data)
    )


def commands(ds: list[Any]) -> list[EngineOpCommand]:
    return [d.event for d in ds if isinstance(d.event, EngineOpCommand)]


def routable(log: Log) -> dict[str, bool]:
    return {k: v.routable for k, v in derive(log.state, {}, {}, LossHold()).items()}


# --------------------------------------------------------------------------- controller + fold


def test_one_command_a_node_of_the_model_then_a_summary_once_all_answered() -> None:
    log = up()
    oid = request(log, "flush-cache")
    cmds = commands(log.step())
    assert sorted(c.data.node_id for c in cmds) == ["n1", "n2"]
    assert {c.data.op for c in cmds} == {"flush-cache"}
    assert log.step() == []  # sent once: waiting for the answers
    assert fleet_progress(log.state, oid) == ("0 of 2 node(s) answered (0 ok, 0 failed)", False)
    answer(log, cmds[0])
    assert log.step() == []
    answer(log, cmds[1], "unsupported")
    done = log.step()
    assert log.types(done) == ["controller.fleet_op_completed"]
    s = done[0].event.data
    assert (s.ok, s.unsupported, s.failed, s.unanswered) == (1, 1, 0, ())  # type: ignore[union-attr]
    assert oid not in log.state.ops.fleet.ops
    line, finished = fleet_progress(log.state, oid)
    assert finished and "1 ok, 1 unsupported, 0 failed" in line
    assert log.step() == []


def test_a_node_that_never_answers_is_named_in_the_summary_after_start_timeout() -> None:
    log = up()
    request(log, "wake")
    cmds = commands(log.step())
    answer(log, cmds[0])
    log.tick(29.0)
    assert log.step() == []
    log.tick(2.0)
    done = log.step()
    assert log.types(done) == ["controller.fleet_op_completed"]
    assert done[0].event.data.unanswered == (cmds[1].data.node_id,)  # type: ignore[union-attr]


def test_an_op_on_a_model_nobody_serves_completes_at_once_with_nothing_done() -> None:
    log = up()
    request(log, "sleep", model="other-model")
    done = log.step()
    assert log.types(done) == ["controller.fleet_op_completed"]
    assert done[0].event.data.ok == 0  # type: ignore[union-attr]


def test_pause_and_sleep_take_the_engines_out_of_routing_until_continue_and_wake() -> None:
    log = up()
    assert routable(log) == {"n1/0": True, "n2/0": True}
    request(log, "pause")
    cmds = commands(log.step())
    first = next(c for c in cmds if c.data.node_id == "n1")
    answer(log, first)
    assert mode_of(log.state.ops.fleet, "n1", first.data.instance_id) == PAUSED
    assert routable(log) == {"n1/0": False, "n2/0": True}
    why = derive(log.state, {}, {}, LossHold())["n1/0"]
    assert "paused" in why.why and not why.failed  # out of routing, not failed
    request(log, "sleep")
    sleep = next(c for c in commands(log.step()) if c.data.node_id == "n1")
    answer(log, sleep)
    assert mode_of(log.state.ops.fleet, "n1", first.data.instance_id) == ASLEEP
    request(log, "wake")
    wake = next(c for c in commands(log.step()) if c.data.node_id == "n1")
    answer(log, wake, "failed")  # a failed wake leaves it asleep
    assert routable(log)["n1/0"] is False
    request(log, "wake")
    answer(log, next(c for c in commands(log.step()) if c.data.node_id == "n1"))
    assert routable(log)["n1/0"] is True


def test_a_lora_adapter_is_served_only_where_it_loaded() -> None:
    log = up()
    request(log, "lora-load", lora_name="sql", path="/adapters/sql")
    cmds = commands(log.step())
    assert all(c.data.args.lora_name == "sql" and c.data.args.path == "/adapters/sql" for c in cmds)
    n1 = next(c for c in cmds if c.data.node_id == "n1")
    n2 = next(c for c in cmds if c.data.node_id == "n2")
    answer(log, n1)
    answer(log, n2, "failed")
    assert adapters_of(log.state.ops.fleet, "n1", n1.data.instance_id) == {"sql"}
    assert adapters_of(log.state.ops.fleet, "n2", n2.data.instance_id) == frozenset()
    assert dict(log.state.ops.fleet.wanted["motor-sim"]) == {"sql": "/adapters/sql"}
    eps = derive(log.state, {}, {}, LossHold())
    assert [k for k, d in eps.items() if d.ep.serves("sql")] == ["n1/0"]
    assert all(d.ep.serves("motor-sim") for d in eps.values())
    request(log, "lora-unload", lora_name="sql")
    answer(log, next(c for c in commands(log.step()) if c.data.node_id == "n1"))
    assert adapters_of(log.state.ops.fleet, "n1", n1.data.instance_id) == frozenset()
    assert "sql" not in log.state.ops.fleet.wanted["motor-sim"]


def test_a_mode_belongs_to_the_instance_not_the_node() -> None:
    log = up()
    request(log, "sleep")
    cmd = next(c for c in commands(log.step()) if c.data.node_id == "n1")
    answer(log, cmd)
    assert mode_of(log.state.ops.fleet, "n1", cmd.data.instance_id) == ASLEEP
    assert mode_of(log.state.ops.fleet, "n1", (cmd.data.instance_id or 0) + 100) is None


def test_fleet_state_survives_a_checkpoint() -> None:
    log = up()
    request(log, "lora-load", lora_name="sql", path="/a")
    cmds = commands(log.step())
    answer(log, cmds[0])
    back = state_from_dict(state_to_dict(log.state))
    assert back.ops.fleet == log.state.ops.fleet


def test_a_request_folded_twice_is_one() -> None:
    log = up()
    oid = request(log, "flush-cache")
    before = log.state.ops.fleet.ops[oid]
    data = FleetOpRequestedData(op_id=oid, op="sleep", model="motor-sim")
    log.add(FleetOpRequested(id=log._id("again"), ts=log.now, source="operator", data=data))
    assert log.state.ops.fleet.ops[oid] == before


# --------------------------------------------------------------------------- route table


@pytest.mark.parametrize(
    ("engine", "op", "method", "path", "body"),
    [
        ("vllm", "flush-cache", "POST", "/reset_prefix_cache", None),
        ("vllm", "sleep", "POST", "/sleep?level=2", None),
        ("vllm", "wake", "POST", "/wake_up", None),
        ("vllm", "pause", "POST", "/pause?mode=keep", None),
        ("vllm", "continue", "POST", "/resume", None),
        ("vllm", "reload-weights", "POST", "/collective_rpc", {"method": "reload_weights"}),
        ("vllm", "lora-load", "POST", "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": "/p"}),
        ("vllm", "lora-unload", "POST", "/v1/unload_lora_adapter", {"lora_name": "a"}),
        ("sglang", "flush-cache", "POST", "/flush_cache", None),
        ("sglang", "pause", "POST", "/pause_generation", {"mode": "in_place"}),
        ("sglang", "continue", "POST", "/continue_generation", {}),
        ("sglang", "reload-weights", "POST", "/update_weights_from_disk", {"model_path": "/p"}),
        ("sglang", "sleep", "POST", "/release_memory_occupation", {}),
        ("sglang", "wake", "POST", "/resume_memory_occupation", {}),
        ("sglang", "lora-load", "POST", "/load_lora_adapter", {"lora_name": "a", "lora_path": "/p"}),
        ("sglang", "lora-unload", "POST", "/unload_lora_adapter", {"lora_name": "a"}),
        ("builtin", "continue", "POST", "/continue_generation", {}),  # its /resume is the snapshot's
    ],
)
def test_each_op_maps_to_the_engines_own_route(
    engine: str, op: str, method: str, path: str, body: dict[str, Any] | None
) -> None:
    route = route_for(engine, op)
    assert route is not None
    args = FleetOpArgs(level=2, lora_name="a", path="/p")
    assert (route.method, route.url_path(args), route.body(args)) == (method, path, body)


def test_every_engine_kind_maps_every_op_and_an_unknown_kind_none() -> None:
    from core.fleetopsdata import FLEET_OPS

    for engine, table in ROUTES.items():
        assert set(table) == set(FLEET_OPS), engine
    assert route_for("tgi", "sleep") is None


def test_an_instance_assembled_later_gets_the_models_wanted_adapters_once() -> None:
    from core.events import DrainRequested, DrainRequestedData, InstanceState

    log = up()
    request(log, "lora-load", lora_name="sql", path="/adapters/sql")
    for c in commands(log.step()):
        answer(log, c)
    assert log.types(log.step()) == ["controller.fleet_op_completed"]
    assert log.step() == []  # every instance has it: nothing wanted
    data = DrainRequestedData(drain_id="d1", target="instance", instance_id=1, timeout=0.0)
    log.add(DrainRequested(id="dr1", ts=log.now, source="operator", data=data))
    log.settle()
    log.agents()
    log.bring_up()  # a fresh instance on the freed node, ACTIVE; the controller asks for the adapter
    new = [i for i, r in log.state.instances.items() if r.state == InstanceState.ACTIVE and i != 2]
    assert len(new) == 1
    evs = [ev for _, ev in log.events]
    reqs = [e for e in evs if isinstance(e, FleetOpRequested) and e.data.requested_by == "controller"]
    assert [(r.data.op, r.data.instance_id, r.data.args.lora_name) for r in reqs] == [
        ("lora-load", new[0], "sql")
    ]
    cmds = [e for e in evs if isinstance(e, EngineOpCommand) and e.data.op_id == reqs[0].data.op_id]
    node = log.state.instances[new[0]].node_ids[0]
    assert [c.data.node_id for c in cmds] == [node]  # only the new instance's node
    answer(log, cmds[0])
    log.settle()
    assert adapters_of(log.state.ops.fleet, node, new[0]) == {"sql"}
    assert log.step() == []


def test_a_refused_engine_op_is_answered_with_its_reason_and_counts_as_failed() -> None:
    from nodeagent.command_handler import answer as answer_cmd
    from nodeagent.errors import Refusal

    log = up()
    request(log, "flush-cache")
    cmds = commands(log.step())
    ev = answer_cmd(
        "n1", "nodeagent/n1", cmds[0], Refusal(code="stale_term", reason="term 0 < 3"), ts=log.now
    )
    assert isinstance(ev, EngineOpCompleted)
    assert ev.data.refused == "stale_term: term 0 < 3" and ev.data.results == ()
    assert ev.data.op_id == cmds[0].data.op_id and ev.data.node_id == "n1"
    log.add(ev)
    answer(log, cmds[1])
    done = log.step()
    assert (done[0].event.data.ok, done[0].event.data.failed) == (1, 1)  # type: ignore[union-attr]
