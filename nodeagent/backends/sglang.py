"""SGLang: `python3 -m sglang.launch_server --model-path … --disaggregation-mode prefill|decode|null`.

SGLang runs its own P/D bootstrap protocol, so its capability is always "bootstrap"; the
prefill engine serves the bootstrap port registered for the node. `--enable-metrics` is
always on: heartbeats read load from `/metrics`. A union engine gets `--disaggregation-mode
null` (seed 002), so a `disaggregation_mode` left in a shared engine_config cannot turn it
into a P/D half. Mooncake over IPv6 gets `MC_USE_IPV6=1` (`mooncake_env`). Multi-node (`nnodes > 1`): `--nnodes`,
`--node-rank`, `--dist-init-addr <master_dp_ip>:<dist_init_port>`; only rank 0 serves HTTP.
"""

from __future__ import annotations

from typing import Any

from core.config import EngineSection
from core.events import Capacity, Role
from nodeagent.backends.launch import LaunchContext, LaunchSpec, int_option
from nodeagent.backends.mooncake_env import ipv6_env
from nodeagent.errors import StartupError
from nodeagent.flags import merge_options, to_flags

DEFAULT_PROGRAM = ("python3", "-m", "sglang.launch_server")
DEFAULT_DIST_INIT_PORT = 5000
_MOTOR_KEYS = (
    "model_path",
    "node_rank",
    "dist_init_port",
    "disaggregation_mode",
    "data_parallel_size_local",
)


def capabilities(section: EngineSection, role: Role) -> tuple[str, ...]:
    """SGLang speaks its bootstrap protocol; any other dispatch_profile is a config error."""
    if section.dispatch_profile not in (None, "bootstrap"):
        raise StartupError(
            f"dispatch_profile {section.dispatch_profile!r} is not supported for engine_type sglang: "
            "SGLang P/D uses its bootstrap protocol (leave dispatch_profile unset or use bootstrap)"
        )
    return ("bootstrap",)


def capacity(section: EngineSection) -> Capacity:
    """Static capacity from SGLang's option names, defaults where absent."""
    d = Capacity()
    block_size = int_option(section, 1, "page_size")
    total_tokens = int_option(section, 0, "max_total_tokens")
    return Capacity(
        max_seq_len=int_option(section, d.max_seq_len, "context_length"),
        total_slots=int_option(section, d.total_slots, "max_running_requests"),
        total_blocks=total_tokens // block_size if total_tokens else d.total_blocks,
        block_size=block_size,
    )


def launch(ctx: LaunchContext) -> LaunchSpec:
    """The `sglang.launch_server` command line of one endpoint."""
    sec, ep = ctx.section, ctx.endpoint
    program = list(sec.launcher) if sec.launcher else list(DEFAULT_PROGRAM)
    base: dict[str, Any] = {
        "model_path": sec.model_path or sec.model,
        "served_model_name": sec.model,
        "host": ep.ip,
        "port": ep.business_port,
    }
    derived: dict[str, Any] = dict(base)
    derived["disaggregation_mode"] = ctx.role.value if ctx.role in (Role.PREFILL, Role.DECODE) else "null"
    if ep.bootstrap_port is not None:
        derived["disaggregation_bootstrap_port"] = ep.bootstrap_port
    derived["enable_metrics"] = True
    nnodes = max(ctx.nnodes, sec.nodes_per_instance())
    if nnodes > 1:
        addr = sec.engine_value("dist_init_addr")
        if addr is None:
            port = int_option(sec, DEFAULT_DIST_INIT_PORT, "dist_init_port")
            addr = f"{ctx.master_dp_ip}:{port}"
        derived |= {"nnodes": nnodes, "node_rank": ctx.node_rank, "dist_init_addr": addr}
    options = merge_options(base, sec.engine_config, derived)
    for key in _MOTOR_KEYS:
        if key not in derived:
            options = merge_options(options, drop=(key,))
    return LaunchSpec(argv=(*program, *to_flags(options)), env=ipv6_env(ctx), serves_http=ctx.node_rank == 0)
