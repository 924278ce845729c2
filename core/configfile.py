"""Reading a config file: Motor's own YAML or JSON, or a MindIE-Motor `user_config.json`
(recognised by its top-level blocks and mapped field by field, `core.mindie`). Apart from
`core.config` so the schema does not import the MindIE mapping that builds on it."""

from __future__ import annotations

from pathlib import PurePath

import orjson
import yaml

from core.config import ClusterConfig, config_from_dict
from core.errors import ConfigError
from core.mindie import config_from_mindie, is_mindie


def parse_config(text: str | bytes, source: str = "<config>") -> ClusterConfig:
    """Parse JSON or YAML text (chosen by the source's suffix, else sniffed) into a config."""
    suffix = PurePath(source).suffix.lower()
    try:
        raw = orjson.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"{source}: not valid {'JSON' if suffix == '.json' else 'YAML'}: {exc}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: top level must be a mapping, got {type(raw).__name__}")
    if is_mindie(raw):  # a MindIE-Motor user_config.json: mapped field by field
        return config_from_mindie(raw, None, source)[0]
    return config_from_dict(raw, source)
