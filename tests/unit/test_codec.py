from typing import Any

import orjson
import pytest

from core import codec
from core.errors import DecodeError, NewerSchema, UnknownEventType
from core.events import EVENT_CLASSES, NodeRegistered
from tests.unit.factories import assembled, ep_status, registered, start_cmd


@pytest.mark.parametrize(
    "ev", [registered("n1"), assembled(1, ["n1"]), start_cmd("n1", 1), ep_status("n1", "READY")]
)
def test_roundtrip(ev: Any) -> None:
    data = codec.encode(ev)
    assert codec.decode(data) == ev
    assert orjson.loads(data)["type"] == ev.type


def test_lax_only_values_still_decode() -> None:
    """Strict validation is only the fast path: a hand-written event with coercible values
    (a string for an int, an int for a float) decodes as before."""
    ev = ep_status("n1", "READY")
    raw = orjson.loads(codec.encode(ev))
    raw["data"]["endpoint_id"] = str(raw["data"]["endpoint_id"])
    raw["ts"] = int(raw["ts"])
    got = codec.decode(orjson.dumps(raw))
    assert got.data.endpoint_id == ev.data.endpoint_id  # type: ignore[union-attr]
    assert got.ts == int(ev.ts) and isinstance(got.ts, float)


def test_every_type_has_a_class() -> None:
    assert len(EVENT_CLASSES) == 29
    for name, cls in EVENT_CLASSES.items():
        assert cls.model_fields["type"].default == name


def test_unknown_type() -> None:
    raw = orjson.dumps({"id": "1", "type": "node.exploded", "ts": 1, "source": "x", "data": {}})
    with pytest.raises(UnknownEventType):
        codec.decode(raw)


def test_newer_version() -> None:
    raw = orjson.loads(codec.encode(registered("n1")))
    raw["schema_version"] = 99
    with pytest.raises(NewerSchema):
        codec.decode(orjson.dumps(raw))


def test_not_json() -> None:
    with pytest.raises(DecodeError):
        codec.decode(b"{nope")


def test_upcaster_lifts_old_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pretend node.registered is at v2, where v1 called the field `ip` instead of `pod_ip`.
    monkeypatch.setattr(NodeRegistered, "SCHEMA_VERSION", 2)
    calls = []

    def v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
        calls.append(raw["schema_version"])
        data = dict(raw["data"])
        data["pod_ip"] = data.pop("ip")
        return {**raw, "data": data}

    monkeypatch.setitem(codec.UPCASTERS, ("node.registered", 1), v1_to_v2)
    raw = orjson.loads(codec.encode(registered("n1")))
    raw["data"]["ip"] = raw["data"].pop("pod_ip")
    raw["schema_version"] = 1
    ev = codec.decode(orjson.dumps(raw))
    assert calls == [1]
    assert ev.schema_version == 2
    assert ev.data.pod_ip == "10.0.0.1"  # type: ignore[union-attr]


@pytest.mark.parametrize("ts", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_non_finite_ts_is_refused(ts: str) -> None:
    """A NaN or infinite `ts` would poison every max() and silence computation of a fold."""
    body = codec.encode(registered("n1")).replace(b'"ts":1.0', f'"ts":{ts}'.encode())
    assert f'"ts":{ts}'.encode() in body
    with pytest.raises(DecodeError):
        codec.decode(body)
    with pytest.raises(DecodeError):
        codec.decode_dict({**orjson.loads(codec.encode(registered("n1"))), "ts": float(ts)})
