"""Issue 24: integers (and floats) from the log are bounded in the event schema.

A hostile or broken producer's out-of-bound value makes its event undecodable (poison: skipped
and counted), so it never reaches a reducer, a decision, routing or an encoder. Each test is
named after what the value did before.
"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from controller.leadership import reign_term
from controller.state_queries import outranking_term
from coordinator.table import RoutingTable
from core.codec import decode, encode
from core.errors import DecodeError
from core.events import EventBase
from core.reducer import fold
from streams.checkpoint import encode_checkpoint
from tests.unit.controller_log import Log, config
from tests.unit.coord_events import heartbeat, instance_events, refreshed, seed_instance
from tests.unit.factories import registered


def hostile(ev: EventBase, path: str, value: Any) -> bytes:
    """`ev` on the wire with the field at dotted `path` set to `value` (stdlib json: it writes
    integers of any size, NaN and Infinity, as a rogue producer may)."""
    raw = orjson.loads(encode(ev))
    *head, last = path.split(".")
    node: Any = raw
    for key in head:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return json.dumps(raw).encode()


def _up() -> Log:
    """A leader of term 1 and one union instance whose node re-registered, so a start is out."""
    log = Log(config(union=1))
    log.lead(1)
    log.register("n1")
    log.bring_up()
    log.register("n1")  # without engines, as after a purge: the instance is started again
    log.settle()
    assert log.state.nodes["n1"].start_cmd is not None
    return log


def _stale_term_refusal(log: Log, seen_term: int) -> bytes:
    log.refused("n1", "stale_term", seen_term=0)
    _, ev = log.events.pop()
    return hostile(ev, "data.seen_term", seen_term)


# ------------------------------------------------------------------ terms


def test_a_refusal_naming_seen_term_2_64_minus_1_is_poison_not_a_reign_no_encoder_can_write() -> None:
    """The leader announced a reign past it, 2**64, which orjson (the lease, every checkpoint)
    cannot write: no controller could lead again."""
    with pytest.raises(DecodeError, match="seen_term"):
        decode(_stale_term_refusal(_up(), 2**64 - 1))


def test_the_largest_seen_term_a_node_may_name_leaves_every_later_reign_writable() -> None:
    from controller.leader import lease_value
    from core.bounds import MAX_SEEN_TERM, MAX_TERM

    log = _up()
    log.add(decode(_stale_term_refusal(log, MAX_SEEN_TERM)))
    seen = outranking_term(log.state)
    assert seen == MAX_SEEN_TERM
    term = reign_term(1, 1, seen)
    assert term == MAX_SEEN_TERM + 1
    log.lead(term)
    encode_checkpoint(log.state)
    lease_value("c1", term)
    # 2**52 reigns still to come, and the last one is announced again rather than past the bound.
    assert MAX_TERM - term == 2**52 - 2
    assert reign_term(MAX_TERM, MAX_TERM, MAX_TERM) == MAX_TERM
    assert decode(hostile(log.events[-1][1], "data.term", MAX_TERM)).data.term == MAX_TERM
    with pytest.raises(DecodeError, match="term"):
        decode(hostile(log.events[-1][1], "data.term", MAX_TERM + 1))


# ------------------------------------------------------------------ what nodes report


NODE = registered("n1", ip="10.0.0.1")
HEARTBEAT = heartbeat("n1", (0, 1, 2))


@pytest.mark.parametrize(
    ("event", "path", "value"),
    [
        (NODE, "data.endpoints.0.business_port", 70000),
        (NODE, "data.endpoints.0.business_port", 0),
        (NODE, "data.endpoints.0.mgmt_port", -1),
        (NODE, "data.endpoints.0.bootstrap_port", 65536),
        (NODE, "data.endpoints.0.id", -1),
        (NODE, "data.capacity.max_seq_len", -4096),
        (NODE, "data.capacity.total_slots", 2**31),
        (NODE, "data.parallel.tp", 0),
        (NODE, "data.instance_id", 2**64 - 1),
        (NODE, "data.running_endpoints", [-3]),
        (HEARTBEAT, "data.endpoints.0.avail_slots", -5),
        (HEARTBEAT, "data.endpoints.0.running", -1),
        (HEARTBEAT, "data.endpoints.0.waiting", 2**63),
        (HEARTBEAT, "data.endpoints.0.avail_blocks", 2**64),
        (HEARTBEAT, "ts", float("inf")),
        (HEARTBEAT, "ts", 1e300),  # no tool can show a time past the year 9999
        (HEARTBEAT, "caused_by", {"id": "x", "seq": -1}),
    ],
)
def test_a_node_reporting_an_out_of_range_number_is_poison(event: EventBase, path: str, value: Any) -> None:
    """A port of 70000 or a negative load reached routing and the controller unchecked."""
    with pytest.raises(DecodeError, match=path.split(".")[-1] if path != "caused_by" else "seq"):
        decode(hostile(event, path, value))


def test_a_registration_with_business_port_70000_never_reaches_the_routing_table() -> None:
    events = instance_events(1, "union")  # type: ignore[arg-type]
    wire = [
        hostile(ev, "data.endpoints.0.business_port", 70000) if i == 0 else encode(ev)
        for i, ev in enumerate(events)
    ]
    decoded = []
    for b in wire:
        try:
            decoded.append(decode(b))
        except DecodeError:
            continue  # the fold skips it as poison
    table = RoutingTable()
    for seq, ev in enumerate(decoded, 1):
        table.apply(ev, seq)
    assert [e.port for e in table.routable()] == []


# ------------------------------------------------------------------ refreshed instances


def test_a_refresh_entry_holding_an_integer_past_64_bits_is_poison() -> None:
    """It folded, and then every checkpoint of the controller raised `Integer exceeds 64-bit range`."""
    ev = refreshed([seed_instance(7)])
    with pytest.raises(DecodeError, match="instances"):
        decode(hostile(ev, "data.instances.0.static_info.group_id", 2**70))


def test_a_refresh_entry_nested_300_deep_is_poison() -> None:
    """It folded, and then every checkpoint raised orjson's `Recursion limit reached`."""
    deep: Any = 1
    for _ in range(300):
        deep = {"a": deep}
    ev = refreshed([seed_instance(7)])
    with pytest.raises(DecodeError, match="instances"):
        decode(hostile(ev, "data.instances.0.x", deep))


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_refresh_entry_holding_nan_or_infinity_is_poison(value: float) -> None:
    """orjson writes NaN as null: a checkpoint would restore another state than the fold's."""
    ev = refreshed([seed_instance(7)])
    with pytest.raises(DecodeError, match="instances"):
        decode(hostile(ev, "data.instances.0.port", value))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("port", "70000"),
        ("port", -1),
        ("port", "8080.5"),
        ("port", "¹"),
        ("bootstrap_port", 0),
        ("id", -5),
    ],
)
def test_a_refreshed_instance_with_an_unusable_number_is_not_routed_and_routing_goes_on(
    field: str, value: Any
) -> None:
    """The refresh API validates what it writes; anyone else's entry reached routing as it was."""
    good = seed_instance(8, port="1030")
    bad = seed_instance(7) | {field: value}
    state = fold(enumerate([refreshed([good]), refreshed([bad], event="add", ids=[7])], 1))
    table = RoutingTable(state)
    assert [(e.key, e.port) for e in table.routable()] == [("ext/8", 1030)]


# ------------------------------------------------------------------ what the controller counts up


def test_a_restart_count_past_any_real_one_waits_the_longest_backoff() -> None:
    """`restart_backoff_initial * 2 ** (crashes - 2)` raised OverflowError past ~1024 crashes."""
    from controller.instance_rules import restart_delay
    from core.bounds import MAX_COUNT
    from core.config import ControllerConfig

    ctrl = ControllerConfig()
    assert restart_delay(ctrl, MAX_COUNT + 1) == ctrl.restart_backoff_max
    assert restart_delay(ctrl, 1100) == ctrl.restart_backoff_max
    assert [restart_delay(ctrl, n) for n in (1, 2, 3, 4)] == [0.0, 1.0, 2.0, 4.0]


def test_an_isolated_instance_whose_start_counted_the_most_restarts_is_restarted_within_bounds() -> None:
    """A start in the log with the largest `restarts` (another tool's, an older controller's):
    the backoff after it overflowed, and the start after it counted one more, which raised."""
    from core.bounds import MAX_COUNT
    from core.events import FaultLevel, InstanceState, InstanceStateChanged, InstanceStateChangedData

    log = Log(config(union=1))
    log.lead(1)
    log.register("n1")
    while log.state.nodes["n1"].start_cmd is None:
        for d in log.decide():
            ev = d.event
            log.add(decode(hostile(ev, "data.restarts", MAX_COUNT)) if ev.type == "command.start" else ev)
    log.agents()
    log.settle()
    assert log.inst(1) == InstanceState.ACTIVE
    data = InstanceStateChangedData(instance_id=1, state=InstanceState.ISOLATED, reason="operator")
    log.add(InstanceStateChanged(id="iso", ts=log.now, source="operator", data=data))
    log.fault("n1", FaultLevel.L3)
    for _ in range(3):
        log.settle()
        log.agents()
        log.tick(70.0)
    restarts = [e.data.restarts for _, e in log.events if e.type == "command.start"]
    assert restarts == [MAX_COUNT, MAX_COUNT], restarts


def test_assembly_past_the_last_instance_id_assembles_nothing() -> None:
    """An instance of the last id in the log (another tool's): the next one would have been
    past every id an event may carry, and decide raised building it."""
    from core.bounds import MAX_INSTANCE_ID
    from tests.unit.factories import assembled

    log = Log(config(union=2))
    log.lead(1)
    log.register("n1")
    log.add(decode(hostile(assembled(1, ["n1"]), "data.instance_id", MAX_INSTANCE_ID)))
    log.register("n2")
    assert [d.event.type for d in log.decide() if d.event.type == "instance.assembled"] == []


def test_a_node_claiming_the_largest_instance_id_it_may_leaves_room_for_new_ones() -> None:
    from core.bounds import MAX_REPORTED_INSTANCE_ID

    log = Log(config(union=2))
    log.lead(1)
    log.register("n1", instance_id=MAX_REPORTED_INSTANCE_ID, running_endpoints=(0,))
    log.register("n2")
    made = [d.event for d in log.decide() if d.event.type == "instance.assembled"]
    ids = sorted(e.data.instance_id for e in made)
    assert ids == [MAX_REPORTED_INSTANCE_ID, MAX_REPORTED_INSTANCE_ID + 1]
    assert all(decode(encode(e)) == e for e in made)


@pytest.mark.parametrize(
    "argv",
    [
        ["fault", "report", "--node", "n1", "--code", "x", "--level", "L3", "--instance", "-1"],
        ["fault", "report", "--node", "n1", "--code", "x", "--level", "L3", "--endpoint", str(2**32)],
        ["precision", "raise", "--d-instance", str(2**64)],
        ["precision", "clear", "--d-instance", "1", "--p-instance", "-2"],
    ],
)
def test_an_operator_naming_a_number_no_event_may_carry_gets_a_usage_error(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The event's bounds refused it in the middle of publishing, with a pydantic traceback."""
    from deploy.cli import build_parser

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    assert f"argument {argv[-2]}: {argv[-1]} is outside" in capsys.readouterr().err
