"""`motor config import user_config.json [--env env.json]`: a MindIE-Motor config as Motor YAML.

The YAML goes to stdout (`> motor.yaml`); what the import accepted but does not use, each
field once with the reason, goes to stderr; a field Motor does not know fails with its JSON
path. `motor up --config user_config.json [--env env.json]` reads the same file directly.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson
import yaml

from core.config import ClusterConfig
from core.errors import ConfigError
from core.mindie import Imported, config_from_mindie, is_mindie


def add_import(csub: Any) -> None:
    """Register `import` under `motor config`."""
    imp = csub.add_parser("import", help="convert a MindIE-Motor user_config.json (+ env.json) to Motor YAML")
    imp.add_argument("file", help="MindIE-Motor user_config.json")
    imp.add_argument("--env", help="its env.json (engine environment variables)")
    imp.set_defaults(func=_import)


def read_text(path: str, what: str = "config") -> bytes:
    """A file's bytes, or a ConfigError naming it."""
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read {what}: {exc.strerror}") from None


def _json(path: str, what: str) -> Any:
    try:
        return orjson.loads(read_text(path, what))
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON: {exc}") from None


def load_mindie_file(path: str, env: str | None) -> tuple[ClusterConfig, Imported] | None:
    """The config of a MindIE file at `path` (None when it is a Motor file); ConfigError when bad."""
    if Path(path).suffix.lower() != ".json":
        if env is not None:
            raise ConfigError(f"{env}: --env goes with a MindIE-Motor user_config.json, not {path}")
        return None
    raw = _json(path, "config")
    if not is_mindie(raw):
        if env is not None:
            raise ConfigError(
                f"{env}: --env goes with a MindIE-Motor user_config.json; {path} is a Motor config"
            )
        return None
    env_raw = _json(env, "env.json") if env is not None else None
    cfg, imported = config_from_mindie(raw, env_raw, path, env or "env.json")
    return cfg, imported


def to_yaml(imported: Imported, source: str, env: str | None) -> str:
    """The imported config as Motor YAML, with where it came from on top."""
    head = f"# Motor cluster config imported from {source}" + (f" and {env}" if env else "")
    head += (
        " by `motor config import`.\n# Fields MindIE-Motor has and Motor does not use are listed on stderr.\n"
    )
    return head + yaml.safe_dump(imported.data, sort_keys=False, default_flow_style=False, allow_unicode=True)


def _import(args: argparse.Namespace) -> int:
    try:
        raw = _json(args.file, "config")
        if not is_mindie(raw):
            raise ConfigError(
                f"{args.file}: not a MindIE-Motor user_config.json (no motor_deploy_config, "
                "motor_engine_*_config ... block); `motor config check` reads Motor configs"
            )
        env_raw = _json(args.env, "env.json") if args.env else None
        _, imported = config_from_mindie(raw, env_raw, args.file, args.env or "env.json")
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    for line in imported.unused_report():
        print(f"{args.file}: {line}", file=sys.stderr)
    sys.stdout.write(to_yaml(imported, args.file, args.env))
    return 0
