"""A model's max_tokens limit, from what its instances registered (issue 12, item 4)."""

from __future__ import annotations

from coordinator.model_limits import ModelLimits, model_limits
from coordinator.table import RoutingTable
from core.events import Capacity, NodeRegistered, Role
from tests.unit.coord_events import instance_events, refreshed, seed_instance


def _with_capacity(events: list, max_seq_len: int) -> list:  # type: ignore[type-arg]
    out = []
    for ev in events:
        if isinstance(ev, NodeRegistered):
            data = ev.data.model_copy(update={"capacity": Capacity(max_seq_len=max_seq_len)})
            ev = ev.model_copy(update={"data": data})
        out.append(ev)
    return out


def test_limits_come_from_registrations_and_refreshes() -> None:
    t = RoutingTable()
    for seq, ev in enumerate(_with_capacity(instance_events(1, Role.UNION, model="a"), 2048), 1):
        t.apply(ev, seq)
    for seq, ev in enumerate(_with_capacity(instance_events(2, Role.UNION, model="a"), 8192), 10):
        t.apply(ev, seq)
    for seq, ev in enumerate(instance_events(3, Role.UNION, model="b"), 20):  # default capacity
        t.apply(ev, seq)
    t.apply(refreshed([seed_instance(4, model="c")]), 30)  # max_output_len 512 of max_seq_len 2048
    assert model_limits(t.state) == {"a": 8192, "b": Capacity().max_seq_len, "c": 512}


def test_model_limits_follow_the_log() -> None:
    t = RoutingTable()
    limits = ModelLimits(t)
    assert limits.get("a") is None and limits.get(None) is None
    for seq, ev in enumerate(_with_capacity(instance_events(1, Role.UNION, model="a"), 2048), 1):
        t.apply(ev, seq)
    assert limits.get("a") == 2048 and limits.get("nope") is None
    t.apply(refreshed([seed_instance(4, model="c")]), 40)
    assert limits.get("c") == 512
    assert limits.get(None) == 2048  # no model named: the largest of any
