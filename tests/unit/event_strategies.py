"""Hypothesis strategies read from the event schema itself: wire events of every type.

`wire_events()` makes the JSON-ready dict of an event of any class in `core.events`, every
number drawn within the bounds its field declares (`core.bounds`), the bounds themselves
included. `hostile_events()` makes one with a single bounded number pushed out of its bounds.
Nothing here lists the fields: a field added to the schema is drawn too, and `leaves` is
what the schema test walks to show that every number has bounds.
"""

from __future__ import annotations

import math
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
from hypothesis import strategies as st
from pydantic import AfterValidator, BaseModel
from pydantic.fields import FieldInfo

from core.bounds import INT64_MIN, UINT64_MAX, json_safe
from core.events import ALL_EVENTS, EventBase

Path = tuple[str, ...]  # field names, "[]" for an element of a tuple or the value of a dict
Vocab = Mapping[str, st.SearchStrategy[Any]]  # field name -> realistic values for it (mixed in)


@dataclass(frozen=True)
class Leaf:
    """A number (or a JSON object from outside) somewhere in an event, and its declared bounds."""

    path: Path
    kind: type  # int, float or dict (a JsonObject)
    lo: float | None
    hi: float | None
    finite: bool  # floats: NaN and infinity refused
    checked: bool  # dicts: validated as JSON every encoder writes back


def _bounds(meta: list[Any]) -> tuple[float | None, float | None, bool, bool]:
    lo: float | None = None
    hi: float | None = None
    finite = checked = False
    for m in meta:
        if isinstance(m, FieldInfo):
            l2, h2, f2, c2 = _bounds(list(m.metadata))
            lo, hi = (l2 if l2 is not None else lo), (h2 if h2 is not None else hi)
            finite, checked = finite or f2, checked or c2
        elif isinstance(m, annotated_types.Ge):
            lo = m.ge  # type: ignore[assignment]
        elif isinstance(m, annotated_types.Le):
            hi = m.le  # type: ignore[assignment]
        elif getattr(m, "allow_inf_nan", True) is False:
            finite = True
        elif isinstance(m, AfterValidator) and m.func is json_safe:
            checked = True
    return lo, hi, finite, checked


def _unwrap(tp: Any, meta: list[Any]) -> tuple[Any, list[Any]]:
    while get_origin(tp) is Annotated:
        tp, *more = get_args(tp)
        meta = [*meta, *more]
    return tp, meta


def _options(tp: Any) -> tuple[Any, ...] | None:
    if get_origin(tp) in (Union, types.UnionType):
        return get_args(tp)
    return None


def leaves(model: type[BaseModel], path: Path = ()) -> Iterator[Leaf]:
    """Every number and outside JSON object a model holds, with the bounds it declares."""
    for name, field in model.model_fields.items():
        yield from _leaves(field.annotation, list(field.metadata), (*path, name))


def _leaves(tp: Any, meta: list[Any], path: Path) -> Iterator[Leaf]:
    tp, meta = _unwrap(tp, meta)
    options = _options(tp)
    if options is not None:
        for opt in options:
            if opt is not type(None):
                yield from _leaves(opt, meta, path)
        return
    origin = get_origin(tp)
    if origin is tuple:
        yield from _leaves(get_args(tp)[0], [], (*path, "[]"))
    elif origin is dict:
        value_tp = get_args(tp)[1]
        if value_tp is Any:
            lo, hi, finite, checked = _bounds(meta)
            yield Leaf(path, dict, None, None, False, checked)
        else:
            yield from _leaves(value_tp, [], (*path, "[]"))
    elif isinstance(tp, type) and issubclass(tp, BaseModel):
        yield from leaves(tp, path)
    elif tp in (int, float):
        lo, hi, finite, _ = _bounds(meta)
        yield Leaf(path, tp, lo, hi, finite or tp is int, False)


# --------------------------------------------------------------------------- valid values

JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(INT64_MIN, UINT64_MAX)
    | st.sampled_from([INT64_MIN, UINT64_MAX, 0, -1, 65535, 65536])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
# Keys a refresh entry is read by, so hostile entries reach the code that reads them.
JSON_KEYS = st.sampled_from(
    ["id", "ip", "port", "bootstrap_port", "static_info", "dynamic_info", "endpoints", "role",
     "group_id", "total_slots_num", "avail_slots_num", "avail_block_num", "business_port",
     "capabilities", "engine_type", "model_name", "max_seq_len", "max_output_len"]
) | st.text(max_size=4)  # fmt: skip
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(JSON_KEYS, inner, max_size=4),
    max_leaves=12,
)
# Numbers as a refresh entry's reader may meet them: strings of digits, out of range, odd.
NUMBERISH = JSON_SCALARS | st.sampled_from(
    [0, -1, 1, 85, 65535, 65536, 70000, "70000", "8080", "¹", 1.5, 1e20]
)
_SEED_ENTRY: dict[str, Any] = {
    "id": 7,
    "ip": "10.0.0.9",
    "port": "1025",
    "metric_port": "1026",
    "model_name": "m",
    "static_info": {"role": 85, "total_slots_num": 200, "group_id": 0, "max_seq_len": 2048},
    "dynamic_info": {"avail_slots_num": 150, "avail_block_num": 1000},
}
# A seed 001 entry with some of what its reader reads replaced: these reach routing.
ENTRY_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "id": NUMBERISH,
        "port": NUMBERISH,
        "bootstrap_port": NUMBERISH,
        "capabilities": JSON_VALUES,
        "static_info": st.dictionaries(JSON_KEYS, NUMBERISH, max_size=3) | JSON_VALUES,
        "dynamic_info": st.dictionaries(JSON_KEYS, NUMBERISH, max_size=3) | JSON_VALUES,
        "endpoints": st.lists(
            st.fixed_dictionaries(
                {}, optional={"id": NUMBERISH, "business_port": NUMBERISH, "ip": JSON_VALUES}
            ),
            max_size=2,
        )
        | JSON_VALUES,
    },
).map(lambda changes: {**_SEED_ENTRY, **changes})
JSON_OBJECTS = ENTRY_LIKE | st.dictionaries(JSON_KEYS, JSON_VALUES, max_size=6)


def _number(tp: type, lo: float | None, hi: float | None) -> st.SearchStrategy[Any]:
    if tp is int:
        assert lo is not None and hi is not None
        ilo, ihi = int(lo), int(hi)
        edges = sorted({ilo, ihi, min(ilo + 1, ihi), max(ihi - 1, ilo)})
        return st.sampled_from(edges) | st.integers(ilo, min(ihi, ilo + 16)) | st.integers(ilo, ihi)
    flo = lo if lo is not None else -1e300
    fhi = hi if hi is not None else 1e300
    return st.sampled_from([flo, fhi]) | st.floats(flo, fhi, allow_nan=False, allow_infinity=False)


def _value(tp: Any, meta: list[Any], name: str, vocab: Vocab, forced: Path | None) -> st.SearchStrategy[Any]:
    """A JSON-ready value of type `tp`; with `forced`, the leaf at that path is out of bounds."""
    tp, meta = _unwrap(tp, meta)
    options = _options(tp)
    if options is not None:
        real = [o for o in options if o is not type(None)]
        if forced is not None:  # the way to the forced leaf goes through the non-None option
            return st.one_of([_value(o, meta, name, vocab, forced) for o in real if _has(o, forced)])
        drawn = st.one_of([_value(o, meta, name, vocab, None) for o in real])
        return st.none() | drawn if type(None) in options else drawn
    origin = get_origin(tp)
    if origin is tuple:
        inner = get_args(tp)[0]
        if forced is not None:
            bad = _value(inner, [], name, vocab, forced[1:])
            ok = st.lists(_value(inner, [], name, vocab, None), max_size=2)
            return st.tuples(ok, bad, ok).map(lambda t: [*t[0], t[1], *t[2]])
        return st.lists(_value(inner, [], name, vocab, None), max_size=3)
    if origin is dict:
        value_tp = get_args(tp)[1]
        if value_tp is Any:
            return JSON_OBJECTS if forced is None else _hostile_json()
        keys = st.text(max_size=6)
        if forced is not None:
            return st.tuples(keys, _value(value_tp, [], name, vocab, forced[1:])).map(
                lambda kv: {kv[0]: kv[1]}
            )
        return st.dictionaries(keys, _value(value_tp, [], name, vocab, None), max_size=3)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return _model(tp, vocab, forced)
    if forced is not None:
        lo, hi, _, _ = _bounds(meta)
        return _out_of_bounds(tp, lo, hi)
    drawn: st.SearchStrategy[Any]
    if get_origin(tp) is Literal:
        drawn = st.sampled_from(get_args(tp))
    elif isinstance(tp, type) and issubclass(tp, Enum):
        drawn = st.sampled_from([m.value for m in tp])
    elif tp is bool:
        drawn = st.booleans()
    elif tp in (int, float):
        lo, hi, _, _ = _bounds(meta)
        drawn = _number(tp, lo, hi)
    elif tp is str:
        drawn = st.text(max_size=8)
    else:
        raise TypeError(f"no strategy for {tp!r} at {name}")
    return vocab[name] | drawn if name in vocab else drawn


def _has(tp: Any, path: Path) -> bool:
    """Whether a value of `tp` has a leaf at `path`."""
    tp, _ = _unwrap(tp, [])
    if not path:
        return tp in (int, float) or get_origin(tp) is dict
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        field = tp.model_fields.get(path[0])
        return field is not None and _has_field(field.annotation, path[1:])
    if get_origin(tp) in (tuple, dict) and path[0] == "[]":
        return _has(get_args(tp)[-1] if get_origin(tp) is dict else get_args(tp)[0], path[1:])
    options = _options(tp)
    return options is not None and any(_has(o, path) for o in options)


def _has_field(tp: Any, path: Path) -> bool:
    tp, _ = _unwrap(tp, [])
    options = _options(tp)
    if options is not None:
        return any(_has(o, path) for o in options if o is not type(None))
    return _has(tp, path)


def _model(model: type[BaseModel], vocab: Vocab, forced: Path | None) -> st.SearchStrategy[dict[str, Any]]:
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for name, field in model.model_fields.items():
        if forced is not None and forced[0] == name:
            required[name] = _value(field.annotation, list(field.metadata), name, vocab, forced[1:])
            continue
        s = _value(field.annotation, list(field.metadata), name, vocab, None)
        if field.is_required() or name == "type":
            required[name] = s
        else:
            optional[name] = s
    return st.fixed_dictionaries(required, optional=optional)


def _out_of_bounds(tp: Any, lo: float | None, hi: float | None) -> st.SearchStrategy[Any]:
    if tp is int:
        assert lo is not None and hi is not None
        ilo, ihi = int(lo), int(hi)
        edges = [ilo - 1, ihi + 1, ihi + 2**64, ilo - 2**64, 10**30]
        return st.sampled_from(edges) | st.integers(max_value=ilo - 1) | st.integers(min_value=ihi + 1)
    bad = [math.nan, math.inf, -math.inf]
    if lo is not None:
        bad.append(lo - 1.0)
    if hi is not None:
        bad.append(hi * 2 if hi else 1.0)
    return st.sampled_from(bad)


def _hostile_json() -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object no encoder here writes back as read: a huge integer, NaN, or too deep."""
    too_deep = st.integers(33, 300).map(_nest)
    scalar = st.sampled_from([UINT64_MAX + 1, INT64_MIN - 1, 10**40, math.nan, math.inf, -math.inf])
    return st.tuples(JSON_OBJECTS, JSON_KEYS, scalar | too_deep).map(lambda t: {**t[0], t[1]: t[2]})


def _nest(depth: int) -> Any:
    out: Any = 1
    for _ in range(depth):
        out = {"a": out}
    return out


# --------------------------------------------------------------------------- events


def wire_events(
    classes: tuple[type[EventBase], ...] = ALL_EVENTS, vocab: Vocab | None = None
) -> st.SearchStrategy[dict[str, Any]]:
    """The wire form (a JSON-ready dict) of a valid event of any of `classes`."""
    return st.one_of([_model(cls, vocab or {}, None) for cls in classes]).map(_current)


def _current(raw: dict[str, Any]) -> dict[str, Any]:
    raw["schema_version"] = 1  # another is a newer (or older) schema, not a value of this one
    return raw


def hostile_events() -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    """(the path of the broken leaf, the wire form of an event with that one leaf out of bounds)."""
    pairs = [(cls, leaf.path) for cls in ALL_EVENTS for leaf in leaves(cls)]

    def one(pair: tuple[type[EventBase], Path]) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
        cls, path = pair
        made = _model(cls, {}, path)
        if path != ("schema_version",):
            made = made.map(_current)
        return made.map(lambda raw: (".".join(path), raw))

    return st.one_of([one(pair) for pair in pairs])
