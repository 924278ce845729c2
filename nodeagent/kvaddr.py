"""Where an endpoint's engine publishes its KV events, and where the agent listens: pure.

An engine section turns the events on the way vLLM does, `engine_config.kv_events_config:
{enable_kv_cache_events: true}`. Without an `endpoint` the agent picks Unix (ZMQ `ipc://`)
sockets in its run dir, one pair per endpoint, so agents sharing a host never collide; a `tcp`
endpoint is offset by the endpoint's DP rank as vLLM does, and `*` is listened to on the
endpoint's IP.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.config import EngineSection
from core.events import EndpointSpec
from nodeagent.errors import StartupError

# sun_path holds 108 bytes; ZMQ's ipc:// needs the path to fit.
_IPC_MAX = 100


@dataclass(frozen=True, slots=True)
class KvAddrs:
    """The engine's bind addresses (its `kv_events_config`) and the agent's connect addresses."""

    config: dict[str, Any]  # what the engine is given
    sub: str
    replay: str | None


def kv_events_config(section: EngineSection) -> dict[str, Any] | None:
    """The section's `kv_events_config` when it enables events, else None."""
    raw = section.engine_value("kv_events_config")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise StartupError(f"engine_config.kv_events_config is not JSON: {exc}") from None
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise StartupError("engine_config.kv_events_config must be a mapping")
    return raw if raw.get("enable_kv_cache_events") else None


def _offset(endpoint: str, rank: int) -> str:
    """vLLM's per-DP-rank address: a tcp port counts up, another address gets a suffix."""
    if rank == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        base, _, port = endpoint.rpartition(":")
        return f"{base}:{int(port) + rank}"
    return f"{endpoint}_dp{rank}"


def _connect(endpoint: str, ip: str) -> str:
    return endpoint.replace("://*:", f"://{ip}:").replace("://0.0.0.0:", f"://{ip}:")


def _ipc(path: Path) -> str:
    text = str(path)
    if len(text) > _IPC_MAX:  # a deep run dir: a short name in the temp dir, unique per path
        digest = hashlib.sha1(text.encode()).hexdigest()[:16]
        text = str(Path(tempfile.gettempdir()) / f"motor-{digest}{path.suffix}")
    return f"ipc://{text}"


def kv_addrs(section: EngineSection, run_dir: Path, node_id: str, ep: EndpointSpec) -> KvAddrs | None:
    """The KV event addresses of one endpoint, or None when its section publishes none."""
    raw = kv_events_config(section)
    if raw is None:
        return None
    cfg = {"publisher": "zmq", **raw}
    if cfg.get("endpoint"):
        pub = _offset(str(cfg["endpoint"]), ep.dp_rank)
        replay = _offset(str(cfg["replay_endpoint"]), ep.dp_rank) if cfg.get("replay_endpoint") else None
    else:
        pub = _ipc(run_dir / f"kv-{node_id}-{ep.id}.pub")
        replay = _ipc(run_dir / f"kv-{node_id}-{ep.id}.replay")
    cfg["endpoint"], cfg["replay_endpoint"] = pub, replay
    if replay is None:
        del cfg["replay_endpoint"]
    return KvAddrs(cfg, _connect(pub, ep.ip), _connect(replay, ep.ip) if replay else None)
