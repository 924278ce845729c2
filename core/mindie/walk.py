"""Walk a MindIE JSON file against the catalog: values to map, fields unused, errors by path."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.mindie.catalog import Free, Map, Node, Unused


@dataclass
class Walked:
    """What one walk found: mapped values by JSON path, unused fields (path, reason), errors."""

    values: dict[str, Any] = field(default_factory=dict)
    unused: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def get(self, path: str, default: Any = None) -> Any:
        """The value at `path` when the file set it (null counts as unset)."""
        return self.values.get(path, default)


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _kind_ok(kind: str, value: Any) -> bool:
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "str_list":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return False


_EXPECTED = {
    "int": "an integer",
    "number": "a number",
    "bool": "true or false",
    "str": "a string",
    "str_list": "a list of strings",
}


def walk(raw: Any, tree: dict[str, Node], path: str = "", out: Walked | None = None) -> Walked:
    """Check `raw` (a JSON object) against `tree`; collect into `out` (a new one by default)."""
    out = out if out is not None else Walked()
    where = path or "(top level)"
    if not isinstance(raw, dict):
        out.errors.append(f"{where}: must be an object, got {_type_name(raw)}")
        return out
    for key, value in raw.items():
        p = f"{path}.{key}" if path else str(key)
        node = tree.get(key)
        if node is None:
            known = ", ".join(sorted(tree))
            out.errors.append(f"{p}: unknown field (known here: {known})")
        elif isinstance(node, dict):
            if value is not None:
                walk(value, node, p, out)
        elif isinstance(node, Unused):
            out.unused.append((p, node.reason))
        elif isinstance(node, Free):
            if value is not None and not isinstance(value, dict):
                out.errors.append(f"{p}: must be an object, got {_type_name(value)}")
            elif node.target is None:
                out.unused.append((p, node.reason))
            elif value is not None:
                out.values[p] = value
        elif isinstance(node, Map) and value is not None:
            if _kind_ok(node.kind, value):
                out.values[p] = value
            else:
                out.errors.append(f"{p}: must be {_EXPECTED[node.kind]}, got {value!r}")
    return out
