"""The builtin CPU engine: `<python> -m simengine --port … --role … --model …` (or the section's
`launcher` in place of `<python> -m simengine`).

It speaks both P/D protocols, so it reports "handoff" and "bootstrap" unless
`dispatch_profile` narrows it to one. Engine options pass through as flags; the vLLM
spelling of the block count (`num_gpu_blocks[_override]`) is accepted for `--num-blocks`,
and Motor's topology keys (DP, nnodes, KV connector) are not the builtin engine's business.
"""

from __future__ import annotations

from typing import Any

from core.config import EngineSection
from core.events import Capacity, Role
from nodeagent.backends.launch import LaunchContext, LaunchSpec, int_option
from nodeagent.errors import StartupError
from nodeagent.flags import merge_options, option_key, to_flags

PROTOCOLS = ("handoff", "bootstrap")
DEFAULTS = Capacity(max_seq_len=8192, total_slots=256, total_blocks=4096, block_size=16)
_RENAMES = {"num_gpu_blocks": "num_blocks", "num_gpu_blocks_override": "num_blocks"}
_TOPOLOGY_KEYS = frozenset(
    {
        "nnodes",
        "node_rank",
        "master_port",
        "master_addr",
        "headless",
        "data_parallel_size",
        "data_parallel_size_local",
        "data_parallel_rank",
        "data_parallel_address",
        "data_parallel_rpc_port",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "kv_transfer_config",
        "disaggregation_bootstrap_port",
        "disaggregation_mode",
        "model",
        "model_path",
        "enable_fault_tolerance",  # Motor's fault-reporter switch; the builtin engine always has FT status
    }
)


def capabilities(section: EngineSection, role: Role) -> tuple[str, ...]:
    """Both protocols, or the one `dispatch_profile` names."""
    profile = section.dispatch_profile
    if profile is None:
        return PROTOCOLS
    if profile not in PROTOCOLS:
        raise StartupError(
            f"dispatch_profile {profile!r} is not supported for engine_type builtin "
            f"(it speaks {' and '.join(PROTOCOLS)})"
        )
    return (profile,)


def capacity(section: EngineSection) -> Capacity:
    """Static capacity from the builtin engine's options (vLLM spellings accepted)."""
    d = DEFAULTS
    return Capacity(
        max_seq_len=int_option(section, d.max_seq_len, "max_model_len"),
        total_slots=int_option(section, d.total_slots, "max_num_seqs"),
        total_blocks=int_option(
            section, d.total_blocks, "num_blocks", "num_gpu_blocks_override", "num_gpu_blocks"
        ),
        block_size=int_option(section, d.block_size, "block_size"),
    )


def engine_options(section: EngineSection) -> dict[str, Any]:
    """The section's engine options in the builtin engine's vocabulary."""
    out: dict[str, Any] = {}
    for key, value in section.engine_config.items():
        canon = option_key(key)
        if canon in _TOPOLOGY_KEYS:
            continue
        out[_RENAMES.get(canon, key)] = value
    return out


def launch(ctx: LaunchContext) -> LaunchSpec:
    """The builtin engine's command line for one endpoint."""
    sec, ep = ctx.section, ctx.endpoint
    program = list(sec.launcher) if sec.launcher else [ctx.python, "-m", "simengine"]
    base: dict[str, Any] = {
        "host": ep.ip,
        "port": ep.business_port,
        "role": ctx.role.value,
        "model": sec.model,
    }
    derived: dict[str, Any] = dict(base)
    if ep.bootstrap_port is not None:
        derived["bootstrap_port"] = ep.bootstrap_port
    if ctx.kv_events is not None:
        derived["kv_events_config"] = dict(ctx.kv_events)
    options = merge_options(base, engine_options(sec), derived)
    return LaunchSpec(argv=(*program, *to_flags(options)))
