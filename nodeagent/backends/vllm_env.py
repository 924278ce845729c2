"""The environment a real `vllm serve` needs per endpoint, beyond its command line.

Learned by running vLLM's CPU build on 2-core machines:
- Each engine gets its own ZMQ socket dir (`VLLM_RPC_BASE_PATH`) and cache root
  (`VLLM_CACHE_ROOT`) under `<tmp>/motor-vllm/<ip>-<port>/`: engines sharing a host then
  never share compile caches, and the sockets a killed engine leaves behind stay in its own
  dir. The agent creates the dirs (`LaunchSpec.dirs`) before spawning.
- A model given as a local path needs no hub; `HF_HUB_OFFLINE=1` keeps transformers from
  trying one (on a closed network that is a long timeout per lookup).
- `NixlConnector` opens a side channel the peer engine connects to: one port per engine
  (`VLLM_NIXL_SIDE_CHANNEL_PORT`, vLLM adds the DP index itself) on the endpoint's IP
  (`VLLM_NIXL_SIDE_CHANNEL_HOST`, which the prefill echoes back in `kv_transfer_params`).
  With `kv_buffer_device: cpu` UCX must use TCP (`UCX_TLS=tcp,self`): there is no device
  transport to pick.
- `MC_USE_IPV6=1` for Mooncake over IPv6 (`mooncake_env`).
A variable the engine section sets in `env` always wins: these are defaults, not overrides.
"""

from __future__ import annotations

import tempfile
from pathlib import PurePosixPath
from typing import Any

from nodeagent.backends.launch import LaunchContext
from nodeagent.backends.mooncake_env import ipv6_env

# Distance of the NIXL side-channel port from the business port when the endpoint has no
# registered bootstrap port: above the usual engine range (9000+), below ephemeral ports.
NIXL_PORT_OFFSET = 10000


def work_root(ctx: LaunchContext) -> PurePosixPath:
    """The endpoint's private dir: `<tmp>/motor-vllm/<ip>-<port>` (short: socket paths are capped)."""
    ep = ctx.endpoint
    return (
        PurePosixPath(tempfile.gettempdir()) / "motor-vllm" / f"{ep.ip.replace(':', '_')}-{ep.business_port}"
    )


def is_local_path(model: str) -> bool:
    """A filesystem path rather than a hub id (`org/name`: no leading `/`, `.` or `~`)."""
    return model.startswith(("/", ".", "~"))


def nixl_side_channel_port(ctx: LaunchContext) -> int:
    """The registered bootstrap port, else the business port shifted out of the engine range."""
    ep = ctx.endpoint
    if ep.bootstrap_port is not None:
        return ep.bootstrap_port
    port = ep.business_port + NIXL_PORT_OFFSET
    return port if port <= 65535 else ep.business_port - NIXL_PORT_OFFSET


def runtime_env(ctx: LaunchContext, ktc: dict[str, Any] | None) -> tuple[dict[str, str], tuple[str, ...]]:
    """(env, dirs to create) for one endpoint's engine; `ktc` is its final kv-transfer-config."""
    root = work_root(ctx)
    rpc, cache = str(root / "rpc"), str(root / "cache")
    env: dict[str, str] = {"VLLM_RPC_BASE_PATH": rpc, "VLLM_CACHE_ROOT": cache}
    model = ctx.section.model_path or ctx.section.model
    if is_local_path(model):
        env["HF_HUB_OFFLINE"] = "1"
    if ktc is not None and _uses_nixl(ktc):
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = ctx.endpoint.ip
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(nixl_side_channel_port(ctx))
        if str(ktc.get("kv_buffer_device", "")).lower() == "cpu":
            env["UCX_TLS"] = "tcp,self"
    env.update(ipv6_env(ctx))
    env = {k: v for k, v in env.items() if k not in ctx.section.env}
    return env, tuple(env[k] for k in ("VLLM_RPC_BASE_PATH", "VLLM_CACHE_ROOT") if k in env)


def _uses_nixl(ktc: dict[str, Any]) -> bool:
    names = [ktc.get("kv_connector")]
    extra = ktc.get("kv_connector_extra_config")
    subs = (extra or {}).get("connectors") if isinstance(extra, dict) else None
    for sub in [*(subs or []), *(ktc.get("connectors") or [])]:
        if isinstance(sub, dict):
            names.append(sub.get("kv_connector"))
    return any(str(n).lower() == "nixlconnector" for n in names if n)
