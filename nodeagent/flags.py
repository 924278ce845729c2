"""Engine options to native command-line flags, the same rules for every backend.

`None` is omitted, `True` is a bare `--flag` and `False` is nothing, dicts become one JSON
argument, lists become one flag followed by its values, and snake_case keys become kebab-case.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import orjson


def flag_name(key: str) -> str:
    """`max_model_len` and `max-model-len` both become `--max-model-len`."""
    return "--" + key.strip().lstrip("-").replace("_", "-")


def option_key(key: str) -> str:
    """The canonical (snake_case) spelling of an option key, for lookups and overrides."""
    return key.strip().lstrip("-").replace("-", "_")


def render_value(value: Any) -> str:
    """One argument's text: dicts as compact JSON, everything else as its plain string."""
    if isinstance(value, Mapping):
        return orjson.dumps(dict(value), option=orjson.OPT_SORT_KEYS).decode()
    return str(value)


def to_flags(options: Mapping[str, Any]) -> list[str]:
    """Render options (in their order) as argv items following the module's rules."""
    argv: list[str] = []
    for key, value in options.items():
        if value is None or value is False:
            continue
        name = flag_name(key)
        if value is True:
            argv.append(name)
        elif isinstance(value, list | tuple):
            if value:
                argv.append(name)
                argv.extend(render_value(v) for v in value)
        else:
            argv.extend((name, render_value(value)))
    return argv


def merge_options(*layers: Mapping[str, Any], drop: Iterable[str] = ()) -> dict[str, Any]:
    """Merge option dicts; later layers win, keys compared in snake_case; `drop` keys removed.

    The first spelling seen keeps its position so the command line stays stable.
    """
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for layer in layers:
        for key, value in layer.items():
            canon = option_key(key)
            if canon in spelled:
                out[spelled[canon]] = value
            else:
                spelled[canon] = key
                out[key] = value
    for key in drop:
        spelling = spelled.get(option_key(key))
        if spelling is not None:
            out.pop(spelling, None)
    return out
