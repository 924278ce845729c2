"""`motor config check FILE` and `motor config show`: validate and print a cluster config."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from core.errors import ConfigError
from core.redact import redact
from deploy.common import load_config_file
from deploy.config_import import add_import


def register(sub: Any) -> None:
    p = sub.add_parser("config", help="validate or print a cluster config")
    csub = p.add_subparsers(dest="config_cmd", metavar="ACTION", required=True)
    check = csub.add_parser("check", help="validate a config file and report every bad field")
    check.add_argument("file")
    check.set_defaults(func=_check)
    show = csub.add_parser(
        "show", help="print the effective config (defaults and secrets filled in, secrets masked) as JSON"
    )
    show.add_argument("file", nargs="?")
    show.set_defaults(func=_show)
    add_import(csub)


def _check(args: argparse.Namespace) -> int:
    try:
        cfg = load_config_file(args.file)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    roles = ", ".join(f"{r.value}×{s.instances}" for r, s in cfg.sections().items())
    print(f"{args.file}: ok ({roles})")
    return 0


def _show(args: argparse.Namespace) -> int:
    try:
        cfg = load_config_file(args.file)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    shown = redact(cfg.model_dump(mode="json"))
    sys.stdout.write(orjson.dumps(shown, option=orjson.OPT_INDENT_2).decode() + "\n")
    return 0
