"""Secrets from the environment or from files, laid over a parsed config.

Keys and passwords do not belong in a config file that gets copied around, nor on a command
line (`ps` shows it to every user). Each secret field may instead be given
- by an environment variable (`ENV` below), which wins over the file, or
- by a `*_file` field in the config naming a file: one key per line for key lists (blank
  lines and `#` comments skipped), the first line for a password or token.

Pure: the caller passes the environment and a function that reads a file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from core.config import ClusterConfig
from core.errors import ConfigError

# Environment variable -> (config section, field). Key lists are comma- or newline-separated.
ENV: dict[str, tuple[str, str]] = {
    "MOTOR_COORDINATOR_API_KEYS": ("coordinator", "api_keys"),
    "MOTOR_COORDINATOR_ADMIN_KEYS": ("coordinator", "admin_keys"),
    "MOTOR_CONTROLLER_API_KEYS": ("controller", "api_keys"),
    "MOTOR_NATS_PASSWORD": ("nats", "password"),
    "MOTOR_NATS_TOKEN": ("nats", "token"),
}

Reader = Callable[[str], str]


def resolve_secrets(cfg: ClusterConfig, env: Mapping[str, str], read: Reader) -> ClusterConfig:
    """`cfg` with every secret taken from its `*_file` field and then from the environment."""
    updates: dict[str, dict[str, Any]] = {}
    for section, field in ENV.values():
        file = getattr(getattr(cfg, section), f"{field}_file")
        if file is not None:
            updates.setdefault(section, {})[field] = _from_file(read, file, f"{section}.{field}_file", field)
    for var, (section, field) in ENV.items():
        raw = env.get(var)
        if raw is not None:
            updates.setdefault(section, {})[field] = _parse(raw, var, field)
    if not updates:
        return cfg
    changed = {
        section: getattr(cfg, section).model_copy(update=fields) for section, fields in updates.items()
    }
    return cfg.model_copy(update=changed)


def _is_list(field: str) -> bool:
    return field.endswith("_keys")


def _from_file(read: Reader, path: str, where: str, field: str) -> Any:
    try:
        text = read(path)
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read {path}: {exc.strerror or exc}") from None
    if _is_list(field):
        keys = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        if not keys:
            raise ConfigError(f"{where}: {path} holds no key (one key a line)")
        _check_keys(keys, where)
        return keys
    first = text.splitlines()[0].strip() if text.strip() else ""
    if not first:
        raise ConfigError(f"{where}: {path} is empty")
    return first


def _parse(raw: str, var: str, field: str) -> Any:
    if _is_list(field):
        keys = [k.strip() for part in raw.splitlines() for k in part.split(",") if k.strip()]
        if not keys:
            raise ConfigError(f"{var}: holds no key (comma- or newline-separated keys)")
        _check_keys(keys, var)
        return keys
    if not raw:
        raise ConfigError(f"{var}: is empty")
    return raw


def _check_keys(keys: list[str], where: str) -> None:
    for k in keys:
        if any(c.isspace() for c in k):
            raise ConfigError(f"{where}: a key must not contain whitespace")
