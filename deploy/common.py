"""Helpers shared by the CLI commands: config loading, NATS options from flags."""

from __future__ import annotations

from pathlib import Path

from core.config import ClusterConfig, default_config, parse_config
from core.errors import ConfigError


def load_config_file(path: str | None) -> ClusterConfig:
    """Read and validate a cluster config; `None` gives the embedded default."""
    if path is None:
        return default_config()
    p = Path(path)
    try:
        text = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config: {exc.strerror}") from None
    return parse_config(text, str(p))
