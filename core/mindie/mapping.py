"""From a walked MindIE file to Motor's config as plain data, remembering where each value came from.

Engine blocks become sections (`motor_engine_prefill_config` -> `prefill` ...). Their
`engine_config` passes to the engine as native flags, except the served model name (->
`model`) and the weights path (vLLM `model`, SGLang `model_path` -> `model_path`). The legacy
`model_config` / `parallel_config` blocks are flattened into it with seed 002's field
mapping, `engine_config` taking precedence (`_flatten_config`). `motor_deploy_config` gives
the instance counts, nodes per instance and devices per node; the node manager blocks the
fault reporter and snapshot settings (the engine block's own block wins over the top-level
one); `env.json` the engines' environment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.mindie.catalog import ENGINE_BLOCKS
from core.mindie.walk import Walked

# Seed 002, VLLMConfig `_get_default_mapping()`: legacy model/parallel keys -> vLLM options.
VLLM_LEGACY_KEYS = {
    "model_path": "model",
    "model_name": "served_model_name",
    "npu_mem_utils": "gpu_memory_utilization",
    "dp_size": "data_parallel_size",
    "tp_size": "tensor_parallel_size",
    "pp_size": "pipeline_parallel_size",
    "enable_ep": "enable_expert_parallel",
    "dp_rpc_port": "data_parallel_rpc_port",
    "cp_kv_cache_interleave_size": "cp_kv_cache_interleave_size",
}
OTHER_LEGACY_KEYS = {"model_name": "served_model_name"}

# scheduler_type -> Motor policy per role.
POLICIES = {
    "load_balance": {"union": "least_load", "prefill": "least_load", "decode": "least_load"},
    "round_robin": {"union": "round_robin", "prefill": "round_robin", "decode": "round_robin"},
    "kv_cache_affinity": {"union": "prefix_affinity", "prefill": "prefix_affinity", "decode": "least_load"},
}
DEPLOY_KEYS = {"prefill": "p", "decode": "d", "union": "hybrid"}
ENGINE_TYPES = ("vllm", "sglang", "builtin")


def option_key(key: str) -> str:
    """An engine option's canonical (snake_case) spelling."""
    return key.strip().lstrip("-").replace("-", "_")


@dataclass
class Built:
    """Motor's config as plain data, plus `provenance`: Motor path -> the JSON path it came from."""

    data: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def put(self, motor: str, value: Any, source: str) -> None:
        """Set the Motor field at dotted path `motor` to `value`, from JSON path `source`."""
        node = self.data
        *parents, leaf = motor.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
        self.provenance[motor] = source

    def copy(self, w: Walked, source: str, motor: str, convert: Any = None) -> None:
        """Put the walked value at `source` (if set) at `motor`, converted when asked."""
        if source in w.values:
            value = w.values[source]
            self.put(motor, convert(value) if convert else value, source)


def _engine_config(w: Walked, block: str, engine_type: str) -> dict[str, Any]:
    """engine_config with the legacy model/parallel blocks flattened under it (engine wins)."""
    renames = VLLM_LEGACY_KEYS if engine_type == "vllm" else OTHER_LEGACY_KEYS
    out: dict[str, Any] = {}
    for legacy in ("parallel_config", "model_config"):
        for key, value in (w.get(f"{block}.{legacy}") or {}).items():
            out[renames.get(option_key(key), key)] = value
    canon = {option_key(k) for k in w.get(f"{block}.engine_config") or {}}
    out = {k: v for k, v in out.items() if option_key(k) not in canon}
    out.update(w.get(f"{block}.engine_config") or {})
    return out


def _pop(cfg: dict[str, Any], *names: str) -> Any:
    """Remove every spelling of the given options; the first found value."""
    found = None
    for key in list(cfg):
        if option_key(key) in names:
            value = cfg.pop(key)
            found = value if found is None else found
    return found


def _env(w: Walked, role: str) -> dict[str, str]:
    env: dict[str, str] = {}
    for block in ("motor_common_env", f"motor_engine_{role}_env"):
        for key, value in (w.get(f"env.{block}") or {}).items():
            if isinstance(value, bool):
                env[key] = "true" if value else "false"
            elif isinstance(value, str | int | float):
                env[key] = str(value)
            else:
                w.errors.append(f"env.{block}.{key}: must be a string or a number, got {value!r}")
    return env


def _section(w: Walked, b: Built, block: str, role: str) -> None:
    engine_type = w.get(f"{block}.engine_type")
    if engine_type is None:
        b.errors.append(f"{block}.engine_type: is required ({', '.join(ENGINE_TYPES)})")
        return
    if engine_type not in ENGINE_TYPES:
        b.errors.append(f"{block}.engine_type: must be one of {', '.join(ENGINE_TYPES)}, got {engine_type!r}")
        return
    b.put(f"{role}.engine_type", engine_type, f"{block}.engine_type")
    cfg = _engine_config(w, block, engine_type)
    served = _pop(cfg, "served_model_name")
    if isinstance(served, list):
        served = served[0] if served else None
    weights = _pop(cfg, "model", "model_path")
    if served is not None:
        b.put(f"{role}.model", str(served), f"{block}.engine_config.served_model_name")
    elif weights is not None:
        b.put(f"{role}.model", str(weights), f"{block}.engine_config.model")
    if weights is not None:
        b.put(f"{role}.model_path", str(weights), f"{block}.engine_config.model")
    d = DEPLOY_KEYS[role]
    count = w.get(f"motor_deploy_config.{d}_instances_num")
    b.put(f"{role}.instances", 1 if count is None else count, f"motor_deploy_config.{d}_instances_num")
    pods_path = f"motor_deploy_config.single_{d}_instance_pod_num"
    pods = w.get(pods_path)
    nnodes = next((v for k, v in cfg.items() if option_key(k) == "nnodes"), None)
    if pods is not None and nnodes is not None and pods != nnodes:
        b.errors.append(
            f"{pods_path}: {pods} nodes per instance, but {block}.engine_config.nnodes is {nnodes}"
        )
    elif pods is not None and pods > 1 and nnodes is None:
        cfg["nnodes"] = pods
    b.put(f"{role}.engine_config", cfg, f"{block}.engine_config")
    b.copy(w, f"motor_deploy_config.{d}_pod_npu_num", f"{role}.devices_per_node")
    b.copy(w, f"{block}.dispatch_profile", f"{role}.dispatch_profile")
    hc = f"{block}.health_check_config"
    b.copy(w, f"{hc}.health_collector_timeout", f"{role}.health_check_config.timeout")
    b.copy(w, f"{hc}.health_collector_timeout_retry_attempts", f"{role}.health_check_config.retry_attempts")
    b.copy(w, f"{hc}.startup_timeout", f"{role}.health_check_config.startup_timeout")
    for nm in ("motor_nodemanger_config", f"{block}.motor_nodemanger_config"):  # the block's wins
        ft = f"{nm}.fault_tolerance_config"
        if w.get(
            f"{ft}.enable_fault_tolerance"
        ):  # false is the default: the engine's FT flag still turns it on
            b.copy(w, f"{ft}.enable_fault_tolerance", f"{role}.fault_tolerance.enabled")
        b.copy(w, f"{ft}.poll_interval_sec", f"{role}.fault_tolerance.poll_interval")
        b.copy(w, f"{ft}.poll_timeout_sec", f"{role}.fault_tolerance.poll_timeout")
        b.copy(w, f"{ft}.max_poll_failures", f"{role}.fault_tolerance.max_poll_failures")
        b.copy(w, f"{nm}.snapshot_config.enable_snapshot", f"{role}.snapshot.enabled")
        if w.get(f"{nm}.snapshot_config.snapshot_metadata_path"):  # "" means the default path
            b.copy(w, f"{nm}.snapshot_config.snapshot_metadata_path", f"{role}.snapshot.metadata_path")
    if b.data.get(role, {}).get("snapshot", {}).get("enabled"):
        b.copy(w, "motor_deploy_config.job_id", f"{role}.snapshot.namespace")
    env = _env(w, role)
    if env:
        b.put(f"{role}.env", env, f"env.motor_engine_{role}_env")


def _controller(w: Walked, b: Built) -> None:
    c = "motor_controller_config"
    b.copy(w, f"{c}.api_config.controller_api_host", "controller.host")
    b.copy(w, f"{c}.api_config.controller_api_port", "controller.port")
    b.copy(w, f"{c}.instance_config.instance_heartbeat_timeout", "controller.heartbeat_timeout")
    b.copy(w, f"{c}.instance_config.instance_expired_timeout", "controller.terminate_after")
    b.copy(w, f"{c}.instance_config.send_cmd_retry_times", "controller.start_attempts")
    b.copy(w, f"{c}.fault_tolerance_config.enable_scale_p2d", "controller.scale_p2d")
    b.copy(w, f"{c}.standby_config.master_lock_ttl", "controller.lease_ttl")


def _coordinator(w: Walked, b: Built) -> None:
    c = "motor_coordinator_config"
    b.copy(w, f"{c}.api_config.coordinator_api_host", "coordinator.host")
    b.copy(w, f"{c}.api_config.coordinator_api_infer_port", "coordinator.port")
    b.copy(w, f"{c}.api_config.coordinator_api_mgmt_port", "coordinator.mgmt_port")
    e = f"{c}.exception_config"
    b.copy(w, f"{e}.max_retry", "coordinator.retries")
    b.copy(w, f"{e}.transport_max_retry", "coordinator.retries")
    b.copy(w, f"{e}.first_token_timeout", "coordinator.first_token_timeout")
    b.copy(w, f"{e}.infer_timeout", "coordinator.request_timeout")
    b.copy(w, f"{c}.circuit_config.failure_threshold", "coordinator.breaker.failures")
    b.copy(w, f"{c}.circuit_config.base_timeout_s", "coordinator.breaker.backoff_initial")
    b.copy(w, f"{c}.circuit_config.max_timeout_s", "coordinator.breaker.backoff_max")
    sched = f"{c}.scheduler_config.scheduler_type"
    kind = w.get(sched)
    if kind is not None:
        if kind in POLICIES:
            b.put("coordinator.policy", POLICIES[kind], sched)
        else:
            b.errors.append(f"{sched}: must be one of {', '.join(POLICIES)}, got {kind!r}")
    keys = f"{c}.api_key_config"
    if w.get(f"{keys}.enable_api_key"):
        valid = w.get(f"{keys}.valid_keys") or []
        if not valid:
            b.errors.append(f"{keys}.valid_keys: enable_api_key is true but no key is listed")
        b.put("coordinator.api_keys", list(valid), f"{keys}.valid_keys")
    rl = f"{c}.rate_limit_config"
    if w.get(f"{rl}.enable_rate_limit"):
        most, window = w.get(f"{rl}.max_requests", 1000), w.get(f"{rl}.window_size", 60)
        if most < 1 or window <= 0:
            b.errors.append(f"{rl}: max_requests must be >= 1 and window_size > 0, got {most} and {window}")
        else:
            b.put("coordinator.rate_limit.requests_per_second", most / window, f"{rl}.max_requests")
            b.put("coordinator.rate_limit.burst", most, f"{rl}.max_requests")
    size = w.get(f"{rl}.max_request_body_size")
    if size:
        b.put("coordinator.max_body_bytes", int(size * 1024 * 1024), f"{rl}.max_request_body_size")
    b.copy(w, f"{c}.request_limit.max_requests", "coordinator.rate_limit.max_in_flight")
    b.copy(w, f"{c}.token_sampling_config.precision_check_enabled", "coordinator.precision_detector.enabled")
    b.copy(w, f"{c}.prometheus_metrics_config.reuse_time", "coordinator.engine_metrics_interval")


def _nodeagent(w: Walked, b: Built) -> None:
    nm = "motor_nodemanger_config"
    b.copy(w, "motor_deploy_config.job_id", "nodeagent.job_name")
    b.copy(w, f"{nm}.basic_config.job_name", "nodeagent.job_name")  # the node manager's own wins
    b.copy(w, f"{nm}.api_config.pod_ip", "nodeagent.host")
    b.copy(w, f"{nm}.api_config.node_manager_port", "nodeagent.port_base")
    b.copy(w, f"{nm}.endpoint_config.base_port", "nodeagent.engine_port_base")
    b.copy(w, f"{nm}.basic_config.heartbeat_interval_seconds", "nodeagent.heartbeat_interval")


def build(w: Walked, blocks: set[str]) -> Built:
    """Motor's config data from a walked file whose top-level keys are `blocks`."""
    b = Built()
    if "motor_engine_encode_config" in blocks:
        b.errors.append("motor_engine_encode_config: encode (E/PD) instances are not supported by Motor")
    roles = {role for block, role in ENGINE_BLOCKS.items() if block in blocks}
    if not roles:
        b.errors.append(
            "(top level): no engine block; give motor_engine_union_config, or "
            "motor_engine_prefill_config and motor_engine_decode_config"
        )
    if "decode" in roles and "prefill" not in roles:
        b.errors.append("motor_engine_decode_config: a decode block needs motor_engine_prefill_config")
    for role, d in DEPLOY_KEYS.items():
        count = w.get(f"motor_deploy_config.{d}_instances_num")
        if count and role not in roles:
            block = next(k for k, v in ENGINE_BLOCKS.items() if v == role)
            b.errors.append(
                f"motor_deploy_config.{d}_instances_num: {count} {role} instances, but no {block}"
            )
    for block, role in ENGINE_BLOCKS.items():
        if role in roles:
            _section(w, b, block, role)
    _controller(w, b)
    _coordinator(w, b)
    _nodeagent(w, b)
    b.errors.extend(w.errors)
    return b
