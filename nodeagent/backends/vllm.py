"""vLLM: `vllm serve <model> --served-model-name … --port … --kv-transfer-config '<json>'`.

One `vllm serve` per DP rank (vLLM's external load-balancing mode: `--data-parallel-rank`).
P/D capability comes from the KV connector: a whitelisted connector (or `MultiConnector`'s
`connectors[0]`) hands prefill KV to decode ("handoff"); an unknown connector needs an
explicit `dispatch_profile`, else start-up fails naming it. Native vLLM P/D runs only the
handoff protocol, so any other profile is refused (seed 002, fail-closed).

Multi-node TP/PP (`nnodes > 1` with `master_port`, or a DP size of 1): the agent adds
`--nnodes`, `--node-rank`, `--master-addr <master_dp_ip>` and, on ranks other than 0,
`--headless` (no API server there). When DP ranks alone span the nodes, `nnodes` is Motor's
topology key only and is not passed to vLLM.
"""

from __future__ import annotations

from typing import Any

from core.config import EngineSection
from core.events import Capacity, Role
from nodeagent.backends.launch import LaunchContext, LaunchSpec, int_option
from nodeagent.backends.vllm_env import runtime_env
from nodeagent.errors import StartupError
from nodeagent.flags import merge_options, to_flags

# Connectors (lower-case) that move the prefill's KV to the decode engine after prefill.
HANDOFF_CONNECTORS = frozenset(
    {
        "nixlconnector",
        "p2pncclconnector",
        "mooncakeconnector",
        "mooncakeconnectorv1",
        "mooncakelayerwiseconnector",
        "lmcacheconnectorv1",
        "lmcacheconnector",
        "exampleconnector",
        "sharedstorageconnector",
        "llmdatadistcmgrconnector",
        "llmdatadistconnector",
    }
)
# Connectors whose P/D examples run both sides as `kv_both` (they pull and serve KV alike).
# Not NixlConnector: since vLLM 0.32 `kv_both` is deprecated for it (prefill `kv_producer`,
# decode `kv_consumer`; seen in the real engine's start-up warning).
KV_BOTH_CONNECTORS = frozenset({"exampleconnector", "sharedstorageconnector"})
MULTI_CONNECTOR = "multiconnector"

# Keys Motor owns or injects per endpoint; a user value for them is not passed through.
_MOTOR_KEYS = (
    "model",
    "nnodes",
    "node_rank",
    "master_addr",
    "headless",
    "data_parallel_rank",
    "data_parallel_address",
    "data_parallel_size_local",
    "disaggregation_bootstrap_port",
    "kv_transfer_config",
)


def _sub_connectors(ktc: dict[str, Any]) -> list[Any]:
    extra = ktc.get("kv_connector_extra_config")
    if isinstance(extra, dict) and isinstance(extra.get("connectors"), list):
        return list(extra["connectors"])
    if isinstance(ktc.get("connectors"), list):
        return list(ktc["connectors"])
    return []


def transfer_connector(section: EngineSection) -> str | None:
    """The connector that carries KV between P and D: `kv_connector`, or Multi's first."""
    ktc = section.engine_value("kv_transfer_config")
    if ktc is None:
        return None
    if not isinstance(ktc, dict):
        raise StartupError(f"engine_config.kv_transfer_config must be a mapping, got {type(ktc).__name__}")
    name = ktc.get("kv_connector")
    if name is None:
        return None
    if str(name).lower() == MULTI_CONNECTOR:
        subs = _sub_connectors(ktc)
        first = subs[0] if subs else None
        if not isinstance(first, dict) or not first.get("kv_connector"):
            raise StartupError(
                "engine_config.kv_transfer_config: MultiConnector needs connectors[0].kv_connector"
            )
        return str(first["kv_connector"])
    return str(name)


def capabilities(section: EngineSection, role: Role) -> tuple[str, ...]:
    """Dispatch capabilities of a vLLM node; raises StartupError when P/D cannot work."""
    profile = section.dispatch_profile
    if profile is not None:
        if profile != "handoff":
            raise StartupError(
                f"dispatch_profile {profile!r} is not supported for engine_type vllm: "
                "native vLLM P/D runs the handoff protocol only (use dispatch_profile: handoff)"
            )
        return ("handoff",)
    connector = transfer_connector(section)
    if connector is None:
        if role == Role.UNION:
            return ()
        raise StartupError(
            f"{role.value}: engine_type vllm needs engine_config.kv_transfer_config.kv_connector "
            "(e.g. NixlConnector) or dispatch_profile: handoff"
        )
    if connector.lower() in HANDOFF_CONNECTORS:
        return ("handoff",)
    if role == Role.UNION:
        return ()  # a KV store/offload connector on a union engine: no P/D role to play
    raise StartupError(
        f"{role.value}: unknown kv_connector {connector!r} in engine_config.kv_transfer_config; "
        "set dispatch_profile: handoff if it hands prefill KV to decode"
    )


def kv_role(connector: str, role: Role) -> str:
    """The `kv_role` a connector gets on this role."""
    if role == Role.UNION or connector.lower() in KV_BOTH_CONNECTORS:
        return "kv_both"
    return "kv_producer" if role == Role.PREFILL else "kv_consumer"


def kv_transfer_config(section: EngineSection, role: Role) -> dict[str, Any] | None:
    """The `--kv-transfer-config` of this role: `kv_role` filled in where the user left it out."""
    raw = section.engine_value("kv_transfer_config")
    if not isinstance(raw, dict) or not raw.get("kv_connector"):
        return raw if isinstance(raw, dict) else None
    ktc = dict(raw)
    top = str(ktc["kv_connector"])
    if top.lower() == MULTI_CONNECTOR:
        subs = _sub_connectors(ktc)
        if subs and isinstance(subs[0], dict) and subs[0].get("kv_connector"):
            first = dict(subs[0])
            first.setdefault("kv_role", kv_role(str(first["kv_connector"]), role))
            new_subs = [first, *subs[1:]]
            extra = ktc.get("kv_connector_extra_config")
            if isinstance(extra, dict) and isinstance(extra.get("connectors"), list):
                ktc["kv_connector_extra_config"] = {**extra, "connectors": new_subs}
            else:
                ktc["connectors"] = new_subs
            ktc.setdefault("kv_role", first["kv_role"])
        return ktc
    ktc.setdefault("kv_role", kv_role(top, role))
    return ktc


def cross_node(section: EngineSection, nnodes: int) -> bool:
    """Whether one engine spans nodes (TP/PP over torch.distributed), not just DP ranks."""
    return nnodes > 1 and (section.engine_value("master_port") is not None or section.dp_size() == 1)


def capacity(section: EngineSection) -> Capacity:
    """Static capacity from the engine options (vLLM's names), defaults where absent."""
    d = Capacity()
    return Capacity(
        max_seq_len=int_option(section, d.max_seq_len, "max_model_len"),
        total_slots=int_option(section, d.total_slots, "max_num_seqs"),
        total_blocks=int_option(section, d.total_blocks, "num_gpu_blocks_override", "num_gpu_blocks"),
        block_size=int_option(section, d.block_size, "block_size"),
    )


def launch(ctx: LaunchContext) -> LaunchSpec:
    """The `vllm serve` command line of one endpoint."""
    sec, ep = ctx.section, ctx.endpoint
    program = list(sec.launcher) if sec.launcher else ["vllm"]
    base: dict[str, Any] = {"served_model_name": sec.model, "host": ep.ip, "port": ep.business_port}
    derived: dict[str, Any] = dict(base)
    dp = sec.dp_size()
    if dp > 1:
        derived |= {
            "data_parallel_size": dp,
            "data_parallel_rank": ep.dp_rank,
            "data_parallel_address": ctx.master_dp_ip,
        }
    ktc = kv_transfer_config(sec, ctx.role)
    if ktc is not None:
        derived["kv_transfer_config"] = ktc
    if ctx.kv_events is not None:
        derived["kv_events_config"] = dict(ctx.kv_events)
    nnodes = max(ctx.nnodes, sec.nodes_per_instance())
    headless = False
    if cross_node(sec, nnodes):
        headless = ctx.node_rank != 0 or ep.headless
        derived |= {
            "nnodes": nnodes,
            "node_rank": ctx.node_rank,
            "master_addr": ctx.master_dp_ip,
            "headless": headless,
        }
    options = merge_options(base, sec.engine_config, derived, drop=())
    for key in _MOTOR_KEYS:
        if key not in derived:
            options = merge_options(options, drop=(key,))
    argv = [*program, "serve", sec.model_path or sec.model, *to_flags(options)]
    env, dirs = runtime_env(ctx, ktc)
    return LaunchSpec(argv=tuple(argv), env=env, dirs=dirs, serves_http=not headless)
