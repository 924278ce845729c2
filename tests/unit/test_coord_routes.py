"""Candidate choice: every healthy instance of a model competes — union endpoints and P/D pairs alike,
on load — and every fallback (P/D → union → prefill alone) follows from the same choice."""

from __future__ import annotations

import pytest

from coordinator.choose import Chooser, any_path
from coordinator.policies import RequestInfo, make_policy
from coordinator.table import RoutingTable
from core.events import EventBase, Role
from tests.unit.coord_events import heartbeat, instance_events

# Instance ids: 1 union, 2 prefill, 3 decode (builtin, handoff) unless a case says otherwise.
U, P, D = "n1/0", "n2/0", "n3/0"
HANDOFF = ("handoff",)


def cluster(*roles: tuple[int, Role, str, tuple[str, ...]]) -> RoutingTable:
    t = RoutingTable()
    seq = 0
    for iid, role, engine_type, caps in roles:
        for ev in instance_events(iid, role, engine_type=engine_type, capabilities=caps):
            seq += 1
            t.apply(ev, seq)
    return t


def default_cluster() -> RoutingTable:
    return cluster(
        (1, Role.UNION, "builtin", ()),
        (2, Role.PREFILL, "builtin", HANDOFF),
        (3, Role.DECODE, "builtin", HANDOFF),
    )


def router(t: RoutingTable, policy: str = "least_load") -> Chooser:
    return Chooser(t, {r: make_policy(policy) for r in Role})


def info() -> RequestInfo:
    return RequestInfo("motor-sim", None, "r", {"prompt": "hello"})


def route_of(r: Chooser, exclude: set[str] | None = None) -> str | None:
    route = r.choose(r.table.plan("motor-sim"), info(), exclude or set())
    if route is None:
        return None
    if route.prefill is None:
        return route.ep.key
    return f"{route.prefill.key}->{route.ep.key}"


def load(t: RoutingTable, node: str, running: int) -> None:
    events: list[EventBase] = [heartbeat(node, (0, running, 0))]
    for ev in events:
        t.apply(ev, 0)


PD = f"{P}->{D}"


@pytest.mark.parametrize(
    ("loads", "open_", "exclude", "want"),
    [
        # Load decides between a union endpoint and a P/D path (weighed as its decode).
        ({"n1": 5, "n3": 1}, set(), set(), PD),
        ({"n1": 0, "n3": 3}, set(), set(), U),
        # A busy prefill does not make the pair look busy: the decode carries the path.
        ({"n1": 2, "n2": 9, "n3": 1}, set(), set(), PD),
        # Open circuits: the path missing a leg drops out.
        ({"n1": 9}, {D}, set(), U),  # regression: decode circuit open -> union, not 503
        ({"n1": 9}, {P}, set(), U),
        ({"n3": 9}, {U}, set(), PD),
        ({}, {U, D}, set(), P),  # no decode usable, no union: the prefill alone
        ({}, {U, P}, set(), None),  # the decode cannot serve alone
        ({}, {U, P, D}, set(), None),
        # What failed for this request is excluded the same way.
        ({"n1": 9}, set(), {D}, U),
        ({}, {U}, {D}, P),
        ({}, set(), {U, P}, None),
    ],
)
def test_path_choice(loads: dict[str, int], open_: set[str], exclude: set[str], want: str | None) -> None:
    t = default_cluster()
    for node, running in loads.items():
        load(t, node, running)
    t.is_open = open_.__contains__
    assert route_of(router(t), exclude) == want


def test_equal_loads_take_turns_so_no_capacity_idles() -> None:
    """Regression: the union instance never served while a P/D pair existed (load 0/0)."""
    t = default_cluster()
    r = router(t)
    seen = [route_of(r) for _ in range(6)]
    assert seen.count(U) == 3 and seen.count(PD) == 3


def test_a_burst_spreads_over_union_and_pair_by_inflight() -> None:
    """16 requests arriving at once: each counts on its path before the next is routed (the
    attempt loop counts a P/D request on its decode from the moment it is chosen)."""
    t = default_cluster()
    r = router(t)
    got: dict[str, int] = {}
    for _ in range(16):
        route = r.choose(t.plan("motor-sim"), info(), set())
        assert route is not None
        route.ep.inflight += 1
        key = route.ep.key
        got[key] = got.get(key, 0) + 1
    assert got == {U: 8, D: 8}


@pytest.mark.parametrize("policy", ["round_robin", "least_load", "power_of_two", "prefix_affinity"])
def test_every_policy_uses_both_kinds(policy: str) -> None:
    t = default_cluster()
    r = router(t, policy)
    seen = {route_of(r) for _ in range(10)}
    assert seen == {U, PD}


def test_mismatched_pairs_fail_closed_even_as_a_fallback() -> None:
    t = cluster(
        (1, Role.UNION, "vllm", ()),
        (2, Role.PREFILL, "vllm", HANDOFF),
        (3, Role.DECODE, "sglang", ("bootstrap",)),
    )
    r = router(t)
    assert route_of(r) == U
    t.is_open = {U}.__contains__
    assert route_of(r) is None  # a decode is up: a lone prefill is no stand-in for the pair


def test_a_second_protocol_serves_when_the_first_has_no_pair() -> None:
    t = cluster(
        (2, Role.PREFILL, "vllm", HANDOFF),
        (3, Role.DECODE, "vllm", HANDOFF),
        (4, Role.PREFILL, "sglang", ("bootstrap",)),
        (5, Role.DECODE, "sglang", ("bootstrap",)),
    )
    r = router(t)
    assert route_of(r) == "n4/0->n5/0"  # equal rank: the engine types' order decides
    t.is_open = {"n5/0"}.__contains__
    route = r.choose(t.plan("motor-sim"), info(), set())
    assert route is not None and route.capability == "handoff"
    assert route_of(r) == "n2/0->n3/0"


def test_unknown_or_unservable_model_has_no_path() -> None:
    t = cluster((3, Role.DECODE, "builtin", HANDOFF))
    r = router(t)
    assert route_of(r) is None
    assert r.choose(t.plan("other"), RequestInfo("other", None, "r"), set()) is None


def test_any_path_leaves_the_policies_alone() -> None:
    t = default_cluster()
    r = router(t, "round_robin")
    first = route_of(r)
    for _ in range(5):
        assert any_path(t, "motor-sim") is not None
    assert route_of(r) != first  # the rotation moved only for `choose`
    t.is_open = {U, D}.__contains__
    path = any_path(t, "motor-sim")
    assert path is not None and path.ep.key == P
    t.is_open = {U, P}.__contains__
    assert any_path(t, "motor-sim") is None


def test_prefix_is_computed_only_when_a_policy_reads_it() -> None:
    t = cluster((1, Role.UNION, "builtin", ()))
    r = Chooser(
        t,
        {
            Role.UNION: make_policy("least_load"),
            Role.PREFILL: make_policy("prefix_affinity"),
            Role.DECODE: make_policy("least_load"),
        },
    )
    req = RequestInfo("motor-sim", None, "r", {"prompt": "x" * 100})
    assert r.choose(t.plan("motor-sim"), req, set()) is not None
    assert req._prefix is None  # union-only model, least_load: nobody paid for the prefix
    assert req.prefix == b"x" * 100
