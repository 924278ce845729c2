"""`motor engine builtin ARGS`: the builtin engine's own command line (`python -m simengine ARGS`)
under the `motor` CLI, for docs and hands used to it; the flags and the serving are simengine's."""

from __future__ import annotations

import argparse
from typing import Any

from simengine import cli


def register(sub: Any) -> None:
    p = sub.add_parser("engine", help="run an inference engine process (the builtin simulator)")
    esub = p.add_subparsers(dest="engine_kind", metavar="KIND", required=True)
    b = esub.add_parser("builtin", help=cli.HELP, description=cli.DESCRIPTION)
    cli.add_arguments(b)
    b.set_defaults(func=_builtin)


def _builtin(args: argparse.Namespace) -> int:
    return cli.run(args)
