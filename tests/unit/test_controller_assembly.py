"""decide: instance assembly, start commands, resends and the INITIAL -> ACTIVE move."""

from __future__ import annotations

from typing import Any

import pytest

from core.events import EndpointStatus, FaultLevel, InstanceState, Role
from core.state import state_from_dict, state_to_dict
from tests.unit.controller_log import Log, config


def spec(log: Log, iid: int) -> Any:
    return log.state.instances[iid].spec


def test_union_instance_assembled_then_started_then_active() -> None:
    log = Log(config(union=1))
    log.register("n1", ip="10.0.0.7")
    first = log.step()
    assert log.types(first) == ["instance.assembled"]
    s = spec(log, 1)
    assert (s.role, s.master_dp_ip, [m.node_id for m in s.members]) == (Role.UNION, "10.0.0.7", ["n1"])
    assert first[0].event.caused_by is not None and first[0].event.caused_by.seq == 1  # the registration
    starts = log.step()
    assert log.types(starts) == ["command.start:n1"]
    cmd: Any = starts[0].event.data
    assert (cmd.instance_id, cmd.node_rank, cmd.nnodes, cmd.attempt, cmd.master_dp_ip) == (
        1,
        0,
        1,
        1,
        "10.0.0.7",
    )
    assert log.step() == []  # waiting for READY
    log.agents()
    assert log.types(log.step()) == ["instance.state_changed:ACTIVE"]
    assert log.decide() == []


def test_waits_for_enough_nodes_and_ranks_follow_registration_order() -> None:
    log = Log(config(union=1, nnodes=2))
    log.register("b", ip="10.0.0.2")
    assert log.decide() == []
    log.register("a", ip="10.0.0.1")
    log.step()
    s = spec(log, 1)
    assert [(m.node_id, m.node_rank) for m in s.members] == [("b", 0), ("a", 1)]
    assert s.master_dp_ip == "10.0.0.2"
    starts = log.step()
    assert sorted((d.event.data.node_id, d.event.data.node_rank, d.event.data.nnodes) for d in starts) == [  # type: ignore[attr-defined]
        ("a", 1, 2),
        ("b", 0, 2),
    ]


def test_prefill_and_decode_take_nodes_of_their_own_role_only() -> None:
    log = Log(config(prefill=1, decode=1))
    log.register("d1", Role.DECODE)
    log.register("p1", Role.PREFILL)
    log.register("p2", Role.PREFILL)
    log.step()
    roles = {i.spec.role: i.node_ids for i in log.state.instances.values()}
    assert roles == {Role.DECODE: ("d1",), Role.PREFILL: ("p1",)}
    log.bring_up()
    assert {log.inst(1), log.inst(2)} == {InstanceState.ACTIVE}
    assert log.state.nodes["p2"].instance_id is None  # spare


def test_node_of_another_engine_type_is_not_assembled() -> None:
    log = Log(config(union=1))
    log.register("v1", engine_type="vllm")
    assert log.decide() == []


def test_instance_ids_come_from_state_and_count_is_respected() -> None:
    log = Log(config(union=2))
    for n in ("n1", "n2", "n3"):
        log.register(n)
    ds = log.step()
    assert [d.event.data.instance_id for d in ds] == [1, 2]  # type: ignore[attr-defined]
    assert log.state.next_instance_id == 3
    log.bring_up()
    assert log.decide() == []
    assert log.state.nodes["n3"].instance_id is None


def test_d2d_peer_ips_name_a_running_instance_of_the_same_shape() -> None:
    log = Log(config(union=1))
    log.register("n1", ip="10.0.0.1", eps=2)
    log.bring_up()
    log.cfg = config(union=2)
    log.register("n2", ip="10.0.0.2", eps=2)
    asm = log.step()
    assert spec(log, 2).d2d_peer_ips == ("0:10.0.0.1", "1:10.0.0.1")
    assert asm and log.step()[0].event.data.d2d_peer_ips == ("0:10.0.0.1", "1:10.0.0.1")  # type: ignore[attr-defined]


def test_ready_reported_before_the_start_does_not_count() -> None:
    log = Log(config(union=1))
    log.register("n1")
    log.step()
    log.status("n1", 0, "READY")  # stale: before the start command
    log.step()  # start
    assert log.decide() == []
    log.status("n1", 0, "READY")
    assert log.types(log.step()) == ["instance.state_changed:ACTIVE"]


@pytest.mark.parametrize(
    ("agent", "wait", "resent"),
    [
        ("silent", 29.0, False),
        ("silent", 30.0, True),
        ("refused", 0.0, True),
        ("starting", 30.0, False),  # loading: the engine's startup_timeout (20 s) is added
        ("starting", 50.0, True),
    ],
)
def test_start_resent_when_no_ready_in_time(agent: str, wait: float, resent: bool) -> None:
    log = Log(config(union=1))
    log.register("n1")
    log.step()
    log.step()
    if agent == "refused":
        log.refused("n1")
    elif agent == "starting":
        log.applied("n1")
        log.status("n1", 0, "STARTING")
    log.tick(wait)
    ds = log.decide()
    assert log.types(ds) == (["command.start:n1"] if resent else [])
    if resent:
        assert ds[0].event.data.attempt == 2  # type: ignore[attr-defined]
        assert ds[0].event.caused_by.id == log.state.nodes["n1"].start_cmd.data.command_id  # type: ignore[union-attr]


def test_start_attempts_exhausted_raise_a_fault_then_the_node_is_replaced() -> None:
    log = Log(config(union=1))
    log.register("n1")
    log.step()
    log.step()
    for attempt in (2, 3):
        log.tick(31)
        (d,) = log.step()
        assert d.event.data.attempt == attempt  # type: ignore[attr-defined]
    log.tick(31)
    (fault,) = log.step()
    data: Any = fault.event.data
    assert (fault.event.type, data.level, data.code, data.node_id) == (
        "fault.reported",
        FaultLevel.L5,
        "StartRetriesExhausted",
        "n1",
    )
    assert log.types(log.step()) == ["instance.state_changed:ISOLATED"]
    assert log.types(log.step()) == ["command.stop:n1", "instance.state_changed:TERMINATED"]
    assert 1 not in log.state.instances
    assert log.decide() == []  # n1 is blocked by its open L5 fault
    log.register("n2")
    (asm,) = log.step()
    assert asm.event.data.members[0].node_id == "n2"  # type: ignore[attr-defined]


def test_exhausted_fault_is_cleared_when_the_node_registers_again() -> None:
    log = Log(config(union=1))
    log.register("n1")
    log.step()
    log.step()
    for _ in range(3):
        log.tick(31)
        log.settle()
    assert any(f.data.code == "StartRetriesExhausted" for f in log.state.faults.values())
    log.register("n1")
    ds = log.settle()
    assert "fault.cleared:n1" in log.types(ds)
    assert "instance.assembled" in log.types(ds)


def test_reregistration_without_engines_resends_the_start() -> None:
    log = Log(config(union=1))
    log.register("n1")
    log.bring_up()
    assert log.inst(1) == InstanceState.ACTIVE
    log.register("n1", ip="10.0.0.1")  # agent restarted: instance_id=None, nothing running
    ds = log.step()
    assert log.types(ds) == ["command.start:n1"]
    assert ds[0].event.caused_by.seq == log.state.nodes["n1"].registered_seq  # type: ignore[union-attr]
    assert log.state.instances[1].instance_id == 1


def test_reregistration_with_running_engines_needs_no_start() -> None:
    log = Log(config(union=1))
    log.register("n1")
    log.bring_up()
    log.register("n1", ip="10.0.0.1", instance_id=1, running_endpoints=(0,))
    ds = log.step()
    assert log.types(ds) == ["instance.state_changed:DEGRADED"]  # STARTING until it reports READY
    log.status("n1", 0, EndpointStatus.READY)
    assert log.types(log.step()) == ["instance.state_changed:ACTIVE"]


def test_decisions_have_derived_ids_independent_of_now() -> None:
    log = Log(config(union=1))
    log.register("n1")
    a = [d.id for d in log.decide(1000.0)]
    b = [d.id for d in log.decide(1005.0)]
    assert a == b and a
    log.commit(log.decide())
    assert not {d.id for d in log.decide()} & set(a)  # re-deciding after applying adds nothing old


# ------------------------------------------------------------------ a lost log tail


def test_lost_tail_instance_is_readopted_under_its_id() -> None:
    """The log lost instance 7, its node still runs it: assembled again as 7, engines kept."""
    log = Log(config(union=2))
    reg = log.register("n1", instance_id=7, running_endpoints=(0,))
    assert reg == 1
    log.register("n2")
    first = log.step()
    assert sorted((d.event.data.instance_id, d.event.data.members[0].node_id) for d in first) == [  # type: ignore[attr-defined]
        (7, "n1"),
        (8, "n2"),  # a new instance never takes an id a node still runs
    ]
    why = next(d.event.caused_by for d in first if d.event.data.instance_id == 7)  # type: ignore[attr-defined]
    assert why is not None and why.seq == 1  # n1's registration
    log.bring_up()
    assert (log.inst(7), log.inst(8)) == (InstanceState.ACTIVE, InstanceState.ACTIVE)
    assert log.state.next_instance_id == 9


def test_a_terminated_instance_is_never_revived() -> None:
    """The log knows instance 1 ended (ids below next_instance_id): a node still running it
    is an ordinary free node."""
    log = Log(config(union=1))
    log.register("n1")
    log.bring_up()
    assert log.inst(1) == InstanceState.ACTIVE
    log.fault("n1", FaultLevel.L5)
    log.settle()
    assert log.inst(1) is None and log.state.next_instance_id == 2
    log.register("n2", instance_id=1, running_endpoints=(0,))
    ds = log.step()
    assert [(d.event.data.instance_id, d.event.data.members[0].node_id) for d in ds] == [(2, "n2")]  # type: ignore[attr-defined]


def test_lost_instances_coming_back_out_of_order_are_all_readopted() -> None:
    """After a lost log, n1 (running instance 2) is back before n2 (running instance 1): once 2
    is assembled again, 1 is below next_instance_id, yet the log never saw it end."""
    log = Log(config(union=2))
    log.register("n1", instance_id=2, running_endpoints=(0,))
    (asm2,) = log.step()
    assert asm2.event.data.instance_id == 2 and log.state.next_instance_id == 3  # type: ignore[attr-defined]
    log.register("n2", instance_id=1, running_endpoints=(0,))
    ds = [d for d in log.step() if d.event.type == "instance.assembled"]
    assert [(d.event.data.instance_id, d.event.data.members[0].node_id) for d in ds] == [(1, "n2")]  # type: ignore[attr-defined]
    log.bring_up()
    assert (log.inst(1), log.inst(2)) == (InstanceState.ACTIVE, InstanceState.ACTIVE)
    assert 3 not in log.state.instances


def test_retired_ids_survive_a_checkpoint_and_are_derived_for_an_old_one() -> None:
    log = Log(config(union=1))
    log.register("n1")
    log.bring_up()
    log.fault("n1", FaultLevel.L5)
    log.settle()
    assert log.state.retired == frozenset({1})
    raw = state_to_dict(log.state)
    assert state_from_dict(raw).retired == frozenset({1})
    del raw["retired"]  # written before the field: every id below next that is not live ended
    assert state_from_dict(raw).retired == frozenset({1})


def test_multinode_instance_waits_for_all_its_nodes_then_a_grace() -> None:
    log = Log(config(union=1, nnodes=2))
    log.register("a", instance_id=5, running_endpoints=(0,))
    log.register("b")  # free: with "a" it could make a new instance, but "a" is held
    assert log.decide() == []
    log.register("c", instance_id=5, running_endpoints=(0,))
    ds = log.step()
    assert [(d.event.data.instance_id, [m.node_id for m in d.event.data.members]) for d in ds] == [  # type: ignore[attr-defined]
        (5, ["a", "c"])
    ]


def test_held_nodes_are_free_again_after_the_grace() -> None:
    log = Log(config(union=1, nnodes=2))
    log.register("a", instance_id=5, running_endpoints=(0,))
    log.register("b")
    assert log.decide() == []
    log.tick(log.cfg.controller.heartbeat_timeout + 1)
    ds = log.step()
    assert [(d.event.data.instance_id, [m.node_id for m in d.event.data.members]) for d in ds] == [  # type: ignore[attr-defined]
        (6, ["a", "b"])  # its peer never came back: "a" joins a new instance (above the id it ran)
    ]


def test_new_instances_of_an_earlier_role_skip_ids_a_later_role_readopts() -> None:
    log = Log(config(prefill=1, decode=1))  # decode is assembled before prefill
    log.register("p1", Role.PREFILL, instance_id=3, running_endpoints=(0,))
    log.register("d1", Role.DECODE)
    ds = log.step()
    assert sorted((d.event.data.instance_id, d.event.data.role) for d in ds) == [  # type: ignore[attr-defined]
        (3, Role.PREFILL),
        (4, Role.DECODE),
    ]


@pytest.mark.parametrize(
    ("union", "prefill", "decode", "nnodes"),
    [(300, 0, 0, 1), (100, 100, 100, 1), (150, 0, 0, 2)],
)
def test_a_cold_start_of_many_nodes_checks_each_free_node_once_not_once_per_instance(
    monkeypatch: pytest.MonkeyPatch, union: int, prefill: int, decode: int, nnodes: int
) -> None:
    # The free nodes of a role were listed again for every instance assembled: n**2 checks,
    # 0.6 s of one decide at 1000 nodes and 19 s at 4000 (found by `just bench fleet`).
    import controller.assembly as assembly

    log = Log(config(union=union, prefill=prefill, decode=decode, nnodes=nnodes))
    roles = [(Role.UNION, union), (Role.PREFILL, prefill), (Role.DECODE, decode)]
    nodes = [f"{role.value}-{i}" for role, n in roles for i in range(n * nnodes)]
    for role, n in roles:
        for i in range(n * nnodes):
            log.register(f"{role.value}-{i}", role, ip=f"10.{i // 250}.0.{i % 250 + 1}")
    checks = 0
    real = assembly.assemblable

    def counted(*args: Any) -> bool:
        nonlocal checks
        checks += 1
        return real(*args)

    monkeypatch.setattr(assembly, "assemblable", counted)
    made = log.step()
    assert len(made) == union + prefill + decode
    assert checks <= len(nodes)
    members = [m.node_id for d in made for m in d.event.data.members]  # type: ignore[attr-defined]
    assert sorted(members) == sorted(nodes)  # every node in one instance, in registration order
    assert members[: 2 * nnodes] == nodes[: 2 * nnodes]
