"""`python -m tests.bench NAME` runs tests/bench/NAME.py's `main(argv)`; `all` runs every one."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path


def _names() -> list[str]:
    here = Path(__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(here)]) if not m.name.startswith("_"))


def main(argv: list[str]) -> int:
    """Dispatch to one benchmark module, or run them all."""
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m tests.bench NAME|all [ARGS...]\nbenchmarks: {', '.join(_names())}")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    names = _names() if name == "all" else [name]
    unknown = [n for n in names if n not in _names()]
    if unknown:
        print(f"unknown benchmark {unknown[0]!r}; known: {', '.join(_names())}", file=sys.stderr)
        return 2
    rc = 0
    for n in names:
        module = importlib.import_module(f"tests.bench.{n}")
        rc = max(rc, int(module.main(rest) or 0))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
