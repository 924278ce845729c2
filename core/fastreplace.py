"""`replace(obj, **changes)` for frozen dataclasses, several times cheaper than the stdlib's.

`dataclasses.replace` walks the field list and goes through `__init__` on every call; the
reducer calls it a few times per event, which made it the largest cost of a replay. This
version generates one copy function per class (straight attribute copies) on first use.
It gives the same result for our state records: they have no `__post_init__` and no
`InitVar`/`init=False` fields (checked when the copier is built; anything else falls back
to the stdlib).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_COPIERS: dict[type, Callable[..., Any]] = {}


def _build(cls: type) -> Callable[..., Any]:
    fields = dataclasses.fields(cls)
    plain = all(f.init and f._field_type is dataclasses._FIELD for f in fields)  # type: ignore[attr-defined]
    if not plain or hasattr(cls, "__post_init__"):
        return dataclasses.replace
    names = [f.name for f in fields]
    # Copy every field as it is, then set the changed ones: one attribute read per field
    # and one dict walk over the (few) changes, instead of a `kw.get` per field.
    lines = ["def copy(obj, /, **kw):", "    new = _new(_cls)"]
    lines += [f"    _set(new, {n!r}, obj.{n})" for n in names]
    lines += ["    for k, v in kw.items():", "        if k not in _names:"]
    lines += ["            raise TypeError(f'{_cls.__name__} has no field {k!r}')", "        _set(new, k, v)"]
    lines += ["    return new"]
    ns: dict[str, Any] = {
        "_new": object.__new__,
        "_cls": cls,
        "_set": object.__setattr__,
        "_names": frozenset(names),
    }
    exec("\n".join(lines), ns)  # generated from the class's own field names only
    fn: Callable[..., Any] = ns["copy"]
    return fn


def replace(obj: T, /, **changes: Any) -> T:
    """A copy of dataclass instance `obj` with `changes` applied (like `dataclasses.replace`)."""
    cls = type(obj)
    copier = _COPIERS.get(cls)
    if copier is None:
        copier = _COPIERS[cls] = _build(cls)
    result: T = copier(obj, **changes)
    return result
