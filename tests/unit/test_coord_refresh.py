"""Seed 001's refresh body: every rule is a 400 naming the field; valid bodies normalise."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from coordinator.refresh import RefreshError, validate_refresh
from tests.unit.coord_events import seed_instance


def seed_body() -> dict[str, Any]:
    """The seed's own example: one prefill (id 0) and one decode (id 1) peering with it."""
    return {
        "ids": [0, 1],
        "instances": [seed_instance(0, 80, 2), seed_instance(1, 68, 3, peers=[0])],
    }


def with_(path: str, value: Any, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of the body with one field set (value DELETE removes it)."""
    body = copy.deepcopy(base if base is not None else seed_body())
    node: Any = body
    parts = path.replace("]", "").replace("[", ".").split(".")
    for p in parts[:-1]:
        node = node[int(p)] if p.isdigit() else node[p]
    last = parts[-1]
    key: Any = int(last) if last.isdigit() else last
    if value is DELETE:
        del node[key]
    else:
        node[key] = value
    return body


DELETE = object()


def test_the_seed_example_is_valid() -> None:
    data = validate_refresh(seed_body())
    assert data.event == "set" and data.ids == (0, 1)
    assert data.instances[0]["port"] == "1025" and data.instances[1]["dynamic_info"]["peers"] == [0]


def test_integer_ports_are_accepted_and_stored_as_strings() -> None:
    data = validate_refresh(with_("instances[0].port", 8080))
    assert data.instances[0]["port"] == "8080"


def test_extension_fields() -> None:
    body = with_("instances[0].engine_type", "sglang")
    body = with_("instances[0].capabilities", ["bootstrap", "bootstrap"], body)
    body = with_("instances[0].bootstrap_port", 21000, body)
    inst = validate_refresh(body).instances[0]
    assert (inst["engine_type"], inst["capabilities"], inst["bootstrap_port"]) == (
        "sglang",
        ["bootstrap"],
        21000,
    )


@pytest.mark.parametrize(
    ("event", "body_patch"),
    [
        ("add", None),
        ("set", None),
        ("del", {"ids": [1], "instances": []}),
    ],
)
def test_event_verbs(event: str, body_patch: dict[str, Any] | None) -> None:
    body = seed_body()
    body["event"] = event
    if body_patch:
        body.update(body_patch)
    assert validate_refresh(body).event == event


# (path, bad value, field named in the 400)
CASES: list[tuple[str, Any, str]] = [
    ("event", "upsert", "event"),
    ("ids", DELETE, "ids"),
    ("ids", "0,1", "ids"),
    ("ids", [0, -1], "ids[1]"),
    ("ids", [0, 1, 1], "ids[2]"),
    ("ids", [0, True], "ids[1]"),
    ("ids", [0, 2**64], "ids[1]"),
    ("ids", [0], "instances"),  # instance 1 is not listed in ids
    ("ids", [0, 1, 2], "ids"),  # id 2 has no instance
    ("instances", DELETE, "instances"),
    ("instances", {}, "instances"),
    ("instances[1]", "x", "instances[1]"),
    ("instances[1].id", 0, "instances[1].id"),  # duplicate instance id
    ("instances[0].id", DELETE, "instances[0].id"),
    ("instances[0].id", "0", "instances[0].id"),
    ("instances[0].ip", DELETE, "instances[0].ip"),
    ("instances[0].ip", "", "instances[0].ip"),
    ("instances[0].ip", "10.0.0.1 ", "instances[0].ip"),
    ("instances[0].port", DELETE, "instances[0].port"),
    ("instances[0].port", "1023", "instances[0].port"),
    ("instances[0].port", "65536", "instances[0].port"),
    ("instances[0].port", "80a", "instances[0].port"),
    ("instances[0].port", 1.5, "instances[0].port"),
    ("instances[0].port", True, "instances[0].port"),
    ("instances[0].metric_port", DELETE, "instances[0].metric_port"),
    ("instances[0].metric_port", "0", "instances[0].metric_port"),
    ("instances[0].model_name", DELETE, "instances[0].model_name"),
    ("instances[0].model_name", 7, "instances[0].model_name"),
    ("instances[0].static_info", DELETE, "instances[0].static_info"),
    ("instances[0].static_info", [], "instances[0].static_info"),
    ("instances[0].static_info.group_id", DELETE, "instances[0].static_info.group_id"),
    ("instances[0].static_info.group_id", -1, "instances[0].static_info.group_id"),
    ("instances[0].static_info.max_seq_len", 0, "instances[0].static_info.max_seq_len"),
    ("instances[0].static_info.max_seq_len", 1, "instances[0].static_info.max_seq_len"),
    ("instances[0].static_info.max_seq_len", 2**32, "instances[0].static_info.max_seq_len"),
    ("instances[0].static_info.max_output_len", 0, "instances[0].static_info.max_output_len"),
    ("instances[0].static_info.max_output_len", 2048, "instances[0].static_info.max_output_len"),
    ("instances[0].static_info.max_output_len", DELETE, "instances[0].static_info.max_output_len"),
    ("instances[0].static_info.total_slots_num", 0, "instances[0].static_info.total_slots_num"),
    ("instances[0].static_info.total_slots_num", 5001, "instances[0].static_info.total_slots_num"),
    ("instances[0].static_info.total_block_num", 0, "instances[0].static_info.total_block_num"),
    ("instances[0].static_info.block_size", 0, "instances[0].static_info.block_size"),
    ("instances[0].static_info.block_size", 129, "instances[0].static_info.block_size"),
    ("instances[0].static_info.label", DELETE, "instances[0].static_info.label"),
    ("instances[0].static_info.label", 3, "instances[0].static_info.label"),  # contradicts role 80
    ("instances[1].static_info.label", 2, "instances[1].static_info.label"),  # contradicts role 68
    ("instances[0].static_info.role", DELETE, "instances[0].static_info.role"),
    ("instances[0].static_info.role", 81, "instances[0].static_info.role"),
    ("instances[0].dynamic_info", DELETE, "instances[0].dynamic_info"),
    ("instances[0].dynamic_info.avail_slots_num", DELETE, "instances[0].dynamic_info.avail_slots_num"),
    ("instances[0].dynamic_info.avail_slots_num", 201, "instances[0].dynamic_info.avail_slots_num"),
    ("instances[0].dynamic_info.avail_slots_num", -1, "instances[0].dynamic_info.avail_slots_num"),
    ("instances[0].dynamic_info.avail_block_num", 1025, "instances[0].dynamic_info.avail_block_num"),
    ("instances[0].dynamic_info.avail_block_num", DELETE, "instances[0].dynamic_info.avail_block_num"),
    ("instances[1].dynamic_info.peers", DELETE, "instances[1].dynamic_info.peers"),
    ("instances[1].dynamic_info.peers", [0, 0], "instances[1].dynamic_info.peers[1]"),
    ("instances[1].dynamic_info.peers", "0", "instances[1].dynamic_info.peers"),
    ("instances[0].engine_type", "trt", "instances[0].engine_type"),
    ("instances[0].capabilities", "handoff", "instances[0].capabilities"),
    ("instances[0].bootstrap_port", 0, "instances[0].bootstrap_port"),
    ("instances[0].endpoints", {"id": 0}, "instances[0].endpoints"),
    ("instances[0].endpoints", [{"id": 0}], "instances[0].endpoints[0].business_port"),
    ("instances[0].endpoints", [{"business_port": "8080"}], "instances[0].endpoints[0].id"),
    (
        "instances[0].endpoints",
        [{"id": 0, "business_port": "8080"}, {"id": 0, "business_port": "8081"}],
        "instances[0].endpoints[1].id",
    ),
    ("instances[0].endpoints", [{"id": 0, "business_port": "80"}], "instances[0].endpoints[0].business_port"),
    (
        "instances[0].endpoints",
        [{"id": 0, "business_port": "8080", "mgmt_port": "x"}],
        "instances[0].endpoints[0].mgmt_port",
    ),
    (
        "instances[0].endpoints",
        [{"id": 0, "business_port": "8080", "bootstrap_port": 70000}],
        "instances[0].endpoints[0].bootstrap_port",
    ),
]


@pytest.mark.parametrize(("path", "value", "field"), CASES, ids=[f"{p}={v!r}" for p, v, _ in CASES])
def test_every_rule_is_a_400_naming_the_field(path: str, value: Any, field: str) -> None:
    with pytest.raises(RefreshError) as exc:
        validate_refresh(with_(path, value))
    assert exc.value.status == 400
    assert exc.value.field == field, exc.value.message
    assert exc.value.message.startswith(field + ": ")


def test_body_must_be_an_object() -> None:
    with pytest.raises(RefreshError) as exc:
        validate_refresh([1, 2])
    assert exc.value.field == "body"


def test_limits_are_inclusive() -> None:
    body = with_("instances[0].port", "1024")
    body = with_("instances[1].port", "65535", body)
    body = with_("instances[0].static_info.max_output_len", 2047, body)
    body = with_("instances[0].static_info.total_slots_num", 5000, body)
    body = with_("instances[0].static_info.block_size", 1, body)
    body = with_("instances[0].dynamic_info.avail_slots_num", 0, body)
    body = with_("instances[1].dynamic_info.avail_block_num", 1024, body)
    validate_refresh(body)


def test_motor_endpoint_lists() -> None:
    eps = [
        {"id": 0, "ip": "10.0.0.2", "business_port": "8080", "mgmt_port": "8081", "bootstrap_port": 21000},
        {"id": 1, "business_port": 8082},
    ]
    inst = validate_refresh(with_("instances[0].endpoints", eps)).instances[0]
    assert inst["endpoints"] == [
        {"id": 0, "ip": "10.0.0.2", "business_port": "8080", "mgmt_port": "8081", "bootstrap_port": 21000},
        {"id": 1, "business_port": "8082"},
    ]


def test_prefill_needs_no_peers_and_union_may_carry_them() -> None:
    body = {"ids": [5], "instances": [seed_instance(5, 85, 2, peers=[])]}
    assert validate_refresh(body).instances[0]["dynamic_info"]["peers"] == []
