"""Encoding and decoding of events: one TypeAdapter, orjson, upcasting of old versions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from pydantic import TypeAdapter, ValidationError

from core import subjects
from core.errors import DecodeError, NewerSchema, SubjectError, UnknownEventType, WrongSubject
from core.events import EVENT_CLASSES, AnyEvent, EventBase

ADAPTER: TypeAdapter[AnyEvent] = TypeAdapter(AnyEvent)

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]
# (type, from_version) -> function returning the dict at from_version + 1. Empty while every
# event class is at its first schema version: a class whose `SCHEMA_VERSION` goes up adds the
# function lifting its old shape here, so the reducer only knows the current one.
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def current_version(event_type: str) -> int:
    cls = EVENT_CLASSES.get(event_type)
    if cls is None:
        raise UnknownEventType(event_type)
    return cls.SCHEMA_VERSION


def upcast(raw: dict[str, Any]) -> dict[str, Any]:
    """Lift a raw event dict to its type's current schema version."""
    etype = raw.get("type")
    if not isinstance(etype, str):
        raise DecodeError("event has no 'type'")
    target = current_version(etype)
    version = raw.get("schema_version", 1)
    if not isinstance(version, int):
        raise DecodeError(f"event {etype!r} has a non-integer schema_version")
    if version > target:
        raise NewerSchema(etype, version, target)
    while version < target:
        fn = UPCASTERS.get((etype, version))
        if fn is None:
            raise DecodeError(f"no upcaster for {etype!r} from schema_version {version}")
        raw = fn(dict(raw))
        version += 1
        raw["schema_version"] = version
    return raw


def encode(event: EventBase) -> bytes:
    """Serialize an event to its JSON wire form."""
    return event.__pydantic_serializer__.to_json(event, exclude_none=False)


def decode(data: bytes | str, subject: str | None = None) -> AnyEvent:
    """Parse and validate one event; upcast old versions; raise a DecodeError subclass.

    With `subject` (where the event was read), an event whose data names another entity than
    its subject raises `WrongSubject`: permissions guard subjects, the data must agree.
    """
    ev = _decode(data)
    if subject is not None and not subjects.matches(subject, ev):
        try:
            expected = subjects.for_event(ev)
        except SubjectError as exc:
            expected = str(exc)
        raise WrongSubject(ev.type, subject, expected)
    return ev


def _decode(data: bytes | str) -> AnyEvent:
    try:
        # Strict first: what our publishers wrote validates ~1.5x faster without coercion;
        # anything only lax validation accepts (a hand-written "1" for an int) still decodes.
        ev = ADAPTER.validate_json(data, strict=True)
    except ValidationError:
        try:
            ev = ADAPTER.validate_json(data)
        except ValidationError as exc:
            return _refused(data, exc)
    if ev.schema_version != ev.SCHEMA_VERSION:
        return decode_dict(orjson.loads(data))
    return ev


def _refused(data: bytes | str, exc: ValidationError) -> AnyEvent:
    """An event JSON validation refused: an older shape to upcast, else a DecodeError saying why.

    Only an upcast is validated again, from a dict: orjson reads an integer past 64 bits as a
    float and nests deeper than the JSON validator, so a second chance for a current-schema
    event would let through a value out of its bounds (`core.bounds`).
    """
    try:
        raw = orjson.loads(data)
    except orjson.JSONDecodeError as jexc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            raise DecodeError(f"not JSON: {jexc}") from None
        raise DecodeError(f"invalid event: {_short(exc)}") from None  # NaN: JSON to pydantic only
    if not isinstance(raw, dict):
        raise DecodeError("event is not a JSON object") from None
    lifted = upcast(raw)  # an unknown type, a newer schema or a missing upcaster raises here
    if lifted is raw:
        raise DecodeError(f"invalid {raw.get('type')!r} event: {_short(exc)}") from None
    return decode_dict(lifted)


def decode_dict(raw: dict[str, Any]) -> AnyEvent:
    """Validate an event given as a dict, upcasting it first."""
    raw = upcast(raw)
    try:
        return ADAPTER.validate_python(raw)
    except ValidationError as exc:
        raise DecodeError(f"invalid {raw.get('type')!r} event: {_short(exc)}") from None


def _short(exc: ValidationError) -> str:
    errs = exc.errors()[:3]
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errs)
