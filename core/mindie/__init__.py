"""MindIE-Motor's `user_config.json` (+ `env.json`) read as a Motor cluster config.

`is_mindie` recognises the file by its top-level blocks; `import_mindie` walks it against the
field catalog (`catalog.py`: every field mapped, or accepted and reported unused with the
reason; anything else an error naming its JSON path) and builds Motor's config
(`mapping.py`); `config_from_mindie` validates the result, naming the MindIE field again
when a value breaks a Motor rule. Pure: the caller reads the files and prints the notes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from core.config import ClusterConfig
from core.errors import ConfigError
from core.mindie.catalog import ENV_JSON, MINDIE_BLOCKS, USER_CONFIG
from core.mindie.mapping import build
from core.mindie.walk import walk

__all__ = ["Imported", "config_from_mindie", "import_mindie", "is_mindie"]


@dataclass(frozen=True)
class Imported:
    """The Motor config data, the fields accepted but unused (path, reason), where values came from."""

    data: dict[str, Any]
    unused: tuple[tuple[str, str], ...]
    provenance: dict[str, str]

    def unused_report(self) -> list[str]:
        """One line per reason, naming every field it covers (each field once)."""
        by_reason: dict[str, list[str]] = {}
        for path, reason in self.unused:
            by_reason.setdefault(reason, []).append(path)
        return [f"accepted, not used ({reason}): {', '.join(paths)}" for reason, paths in by_reason.items()]


def is_mindie(raw: Any) -> bool:
    """Whether a parsed file is a MindIE-Motor user_config.json (any of its top-level blocks)."""
    return isinstance(raw, dict) and any(key in MINDIE_BLOCKS for key in raw)


def import_mindie(
    user: Any, env: Any = None, source: str = "user_config.json", env_source: str = "env.json"
) -> Imported:
    """Map a MindIE file (and its env.json) to Motor config data; ConfigError names every bad field."""
    w = walk(user, USER_CONFIG)
    errors = [f"  {e}" for e in w.errors]
    if env is not None:
        we = walk(env, ENV_JSON, "env")
        w.values.update(we.values)
        w.unused.extend((f"{env_source}:{p.removeprefix('env.')}", r) for p, r in we.unused)
        errors += [f"  {env_source}: {e.removeprefix('env.')}" for e in we.errors]
    w.errors = []
    blocks = set(user) if isinstance(user, dict) else set()
    built = build(w, blocks)
    errors += [f"  {e}" for e in built.errors]
    if errors:
        raise ConfigError("\n".join([f"{source}: invalid MindIE-Motor config", *errors]))
    return Imported(built.data, tuple(w.unused), built.provenance)


def _seed_path(loc: tuple[Any, ...], provenance: dict[str, str]) -> str:
    parts = [str(p) for p in loc]
    for n in range(len(parts), 0, -1):
        source = provenance.get(".".join(parts[:n]))
        if source is not None:
            rest = parts[n:]
            return source + (f" ({'.'.join(rest)})" if rest else "")
    return ".".join(parts) or "(top level)"


def config_from_mindie(
    user: Any, env: Any = None, source: str = "user_config.json", env_source: str = "env.json"
) -> tuple[Any, Imported]:
    """The validated `ClusterConfig` of a MindIE file and what the import found."""
    imported = import_mindie(user, env, source, env_source)
    try:
        return ClusterConfig.model_validate(imported.data), imported
    except ValidationError as exc:
        lines = [f"{source}: invalid MindIE-Motor config"]
        for err in exc.errors():
            motor = ".".join(str(p) for p in err["loc"])
            got = err.get("input")
            detail = f"  {_seed_path(err['loc'], imported.provenance)}: {err['msg']}"
            if err["type"] != "missing" and not isinstance(got, dict):
                detail += f" (got {got!r})"
            lines.append(detail + (f" [Motor field {motor}]" if motor else ""))
        raise ConfigError("\n".join(lines)) from None
