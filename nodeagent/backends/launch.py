"""What every backend shares: the launch context it is given, the launch it returns, the
protocol a backend module follows, and the helpers that read engine options."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from core.config import EngineSection
from core.events import Capacity, EndpointSpec, Role
from nodeagent.errors import StartupError


@dataclass(frozen=True, slots=True)
class LaunchContext:
    """Everything a backend needs to build the command line of one endpoint (a DP rank)."""

    section: EngineSection
    role: Role
    instance_id: int
    endpoint: EndpointSpec
    master_dp_ip: str
    node_rank: int = 0
    nnodes: int = 1
    python: str = "python3"  # the interpreter that runs `-m simengine` (builtin engine)
    # The engine's `kv_events_config` with the addresses the agent listens to (nodeagent.kvaddr).
    kv_events: Mapping[str, Any] | None = None
    # The environment the engine inherits (before the section's `env`): a default a backend
    # adds must not override what the operator already set.
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    """A native engine launch: argv, extra environment, and whether `/health` is served."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    serves_http: bool = True  # False for a headless multi-node follower (no API server)
    dirs: tuple[str, ...] = ()  # created by the agent before spawning (per-engine socket/cache dirs)


class Backend(Protocol):
    def capabilities(self, section: EngineSection, role: Role) -> tuple[str, ...]: ...

    def capacity(self, section: EngineSection) -> Capacity: ...

    def launch(self, ctx: LaunchContext) -> LaunchSpec: ...


def int_option(section: EngineSection, default: int, *keys: str) -> int:
    """An integer engine option, with a start-up error naming the key when it is not one."""
    for key in keys:
        value = section.engine_value(key)
        if value is None:
            continue
        try:
            return int(value)
        except (TypeError, ValueError):
            raise StartupError(f"engine_config.{key} must be an integer, got {value!r}") from None
    return default
