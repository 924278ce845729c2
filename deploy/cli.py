"""`motor`: one command with subcommands; each lives in a `deploy/cmd_*.py` module.

A module registers itself with `register(subparsers)` and sets `func` on its parser; the
function returns the exit code. Discovery keeps this file free of per-command edits.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

import deploy


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="motor",
        description="Motor on JetStream: event-sourced control plane for LLM inference.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in sorted(pkgutil.iter_modules(deploy.__path__), key=lambda m: m.name):
        if mod.name.startswith("cmd_"):
            module = importlib.import_module(f"deploy.{mod.name}")
            module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `motor` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        return int(func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
