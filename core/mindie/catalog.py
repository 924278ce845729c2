"""Every field of MindIE-Motor's `user_config.json` and `env.json`: mapped, or accepted and unused.

The tree mirrors the file. A leaf is `Map` (Motor consumes it; `target` names the Motor field
and `kind` the JSON type it must have), `Unused` (accepted, reported once with the reason)
or `Free` (an object whose inner keys are the engine's or Kubernetes' business). A JSON
`null` is "not set" (the Motor default stays), as MindIE's defaults are. A key the
tree does not name is an error naming its JSON path. Sources: seed 002's config reference
hunks (health_check_config, fault_tolerance_config, snapshot_config, endpoint_config,
dispatch_profile, motor_engine_union_env) and the MindIE-Motor reference they patch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

Kind = Literal["int", "number", "bool", "str", "str_list"]


@dataclass(frozen=True, slots=True)
class Map:
    """A field Motor consumes; `target` is the Motor field (see core/mindie/mapping.py)."""

    target: str
    kind: Kind


@dataclass(frozen=True, slots=True)
class Unused:
    """A field accepted for compatibility and not consumed."""

    reason: str


@dataclass(frozen=True, slots=True)
class Free:
    """An object whose keys are not checked: the engine's flags, Kubernetes labels, env vars."""

    target: str | None  # Motor field when consumed, None when unused
    reason: str = ""


Node: TypeAlias = "Map | Unused | Free | dict[str, Node]"

K8S = "Kubernetes deployment (deploy.py): Motor runs processes (`motor up`, or your supervisor), not pods"
LOGGING = "logging: Motor's processes log to stderr; engine logs go to `nodeagent.log_dir`"
ETCD = "etcd: Motor's state is the JetStream log (`nats`)"
STANDBY = (
    "leader election is a JetStream KV lease (`controller.lease_ttl`); `motor up` runs a hot "
    "standby controller; coordinators are stateless replicas"
)
TLS = "HTTP TLS is not terminated by Motor (put it in front); the bus's TLS is `nats.tls`"
PORTS = "port allocation: engine ports come from `nodeagent.engine_port_base`, one per endpoint"
CTRL_POLL = "the controller reacts to log events; its timers tick every `controller.tick_interval`"
EVENTS = "events reach the controller and coordinators through JetStream consumers: no polling, no heartbeat between them"
VIRTUAL = "legacy EngineServer virtual inference: accepted for compatibility, not consumed by native engines (seed 002)"
DERIVED = (
    "derived by Motor from the engine blocks and the start command (roles, endpoints, ports, parallel sizes)"
)
KV_POOL = (
    "KV pooling / KV conductor services are not deployed by Motor; configure the connector in engine_config"
)
NM_REMOTE = "node agents reach the controller through NATS, not HTTP"
NM_PER_ROLE = (
    "per-role node manager address/ports: Motor's are cluster-wide (`nodeagent.*`, from the "
    "top-level motor_nodemanger_config) and per-node flags (`motor nodeagent --ip/--port`)"
)
NOT_MODELLED = "not implemented in Motor"
STREAM_CONTINUE = "Motor's coordinator always continues a stream whose decode died (mid-stream continuation)"
DEPLOYER_RUNTIME = "written by the deployer at runtime"
POLICY_INTERNALS = (
    "scheduler internals: Motor's policies are round_robin, least_load, power_of_two, prefix_affinity"
)

LOGGING_CONFIG = Free(None, LOGGING)
TLS_CONFIG = Free(None, TLS)
PORT_ALLOCATOR = Free(None, PORTS)
ETCD_CONFIG = Free(None, ETCD)
STANDBY_CONFIG = Free(None, STANDBY)

FAULT_TOLERANCE: dict[str, Node] = {
    "enable_fault_tolerance": Map("<role>.fault_tolerance.enabled", "bool"),
    "poll_interval_sec": Map("<role>.fault_tolerance.poll_interval", "number"),
    "poll_timeout_sec": Map("<role>.fault_tolerance.poll_timeout", "number"),
    "max_poll_failures": Map("<role>.fault_tolerance.max_poll_failures", "int"),
}
SNAPSHOT: dict[str, Node] = {
    "enable_snapshot": Map("<role>.snapshot.enabled", "bool"),
    "snapshot_metadata_path": Map("<role>.snapshot.metadata_path", "str"),
}


def _nodemanager(nested: bool) -> dict[str, Node]:
    """`motor_nodemanger_config`: top-level (cluster-wide) or inside an engine block (per role)."""
    if nested:
        api: Node = Free(None, NM_PER_ROLE)
        endpoint: Node = Free(None, NM_PER_ROLE)
        basic: Node = Free(None, NM_PER_ROLE)
    else:
        api = {
            "pod_ip": Map("nodeagent.host", "str"),
            "node_manager_port": Map("nodeagent.port_base", "int"),
            "host_ip": Unused(NM_REMOTE),
            "controller_api_dns": Unused(NM_REMOTE),
            "controller_api_port": Unused(NM_REMOTE),
        }
        endpoint = {
            "base_port": Map("nodeagent.engine_port_base", "int"),
            "endpoint_num": Unused(DERIVED),
            "mgmt_ports": Unused(DERIVED),
            "service_ports": Unused(DERIVED),
            "bootstrap_port": Unused(
                DERIVED + "; SGLang's comes from engine_config.disaggregation_bootstrap_port"
            ),
        }
        basic = {
            "heartbeat_interval_seconds": Map("nodeagent.heartbeat_interval", "number"),
            "job_name": Map("nodeagent.job_name", "str"),
            "role": Unused(DERIVED),
            "model_name": Unused(DERIVED),
            "hardware_type": Unused(K8S),
            "device_num": Unused(DERIVED),
            "parallel_config": Free(None, DERIVED),
        }
    return {
        "api_config": api,
        "endpoint_config": endpoint,
        "basic_config": basic,
        "fault_tolerance_config": FAULT_TOLERANCE,
        "snapshot_config": SNAPSHOT,
        "vllm_startup_acceleration_config": Free(
            None,
            "vLLM-Ascend StartPlan/graph reuse is not driven by Motor; pass engine flags in engine_config",
        ),
        "single_container_config": Free(
            None, "single-container mode: `motor up` runs every part on one machine"
        ),
        "mgmt_tls_config": TLS_CONFIG,
        "logging_config": LOGGING_CONFIG,
        "port_allocator_config": PORT_ALLOCATOR,
    }


HEALTH_CHECK: dict[str, Node] = {
    "health_collector_timeout": Map("<role>.health_check_config.timeout", "number"),
    "health_collector_timeout_retry_attempts": Map("<role>.health_check_config.retry_attempts", "int"),
    "startup_timeout": Map("<role>.health_check_config.startup_timeout", "number"),
    "enable_virtual_inference": Unused(VIRTUAL),
    "npu_usage_threshold": Unused(VIRTUAL),
    "max_failure_count": Unused(VIRTUAL),
    "virtual_inference_timeout": Unused(VIRTUAL),
}

ENGINE_BLOCK: dict[str, Node] = {
    "engine_type": Map("<role>.engine_type", "str"),
    "engine_config": Free(
        "<role>.engine_config (served_model_name -> <role>.model, model -> <role>.model_path)"
    ),
    "model_config": Free("<role>.engine_config (legacy; seed 002 field mapping, engine_config wins)"),
    "parallel_config": Free("<role>.engine_config (legacy; seed 002 field mapping, engine_config wins)"),
    "dispatch_profile": Map("<role>.dispatch_profile", "str"),
    "dispatch_capabilities": Unused("internal compatibility field; user values are dropped (seed 002)"),
    "health_check_config": HEALTH_CHECK,
    "motor_nodemanger_config": _nodemanager(nested=True),
    "kv_cache_store_config": Free(None, KV_POOL),
    "additional_annotations": Free(None, K8S),
    "additional_labels": Free(None, K8S),
    "image_name": Unused(K8S),
    "npu_chip_name": Unused(K8S),
}

DEPLOY: dict[str, Node] = {
    "p_instances_num": Map("prefill.instances", "int"),
    "d_instances_num": Map("decode.instances", "int"),
    "hybrid_instances_num": Map("union.instances", "int"),
    "single_p_instance_pod_num": Map("prefill.engine_config.nnodes (nodes per instance)", "int"),
    "single_d_instance_pod_num": Map("decode.engine_config.nnodes (nodes per instance)", "int"),
    "single_hybrid_instance_pod_num": Map("union.engine_config.nnodes (nodes per instance)", "int"),
    "p_pod_npu_num": Map("prefill.devices_per_node", "int"),
    "d_pod_npu_num": Map("decode.devices_per_node", "int"),
    "hybrid_pod_npu_num": Map("union.devices_per_node", "int"),
    "job_id": Map("nodeagent.job_name, <role>.snapshot.namespace", "str"),
    "image_name": Unused(K8S),
    "hardware_type": Unused(K8S),
    "weight_mount_path": Unused(K8S),
    "deploy_mode": Unused(K8S),
    "dshm_size": Unused(K8S),
    "tls_config": TLS_CONFIG,
    "coordinator_infer_node_port": Unused(K8S),
    "coordinator_obs_node_port": Unused(K8S),
    "controller_observability_node_port": Unused(K8S),
    "controller_node_selector": Free(None, K8S),
    "coordinator_node_selector": Free(None, K8S),
    "prefill_node_selector": Free(None, K8S),
    "decode_node_selector": Free(None, K8S),
    "kv_pool_node_selector": Free(None, K8S),
    "kv_conductor_node_selector": Free(None, K8S),
}

_DP_SCALE = "DP-domain scale down/up is not implemented in Motor"
CONTROLLER: dict[str, Node] = {
    "api_config": {
        "controller_api_host": Map("controller.host", "str"),
        "controller_api_port": Map("controller.port", "int"),
        "controller_api_dns": Unused(K8S),
        "observability_api_port": Unused(
            "the controller serves /v1/instances, /v1/alarms and /metrics on controller.port"
        ),
    },
    "instance_config": {
        "instance_heartbeat_timeout": Map("controller.heartbeat_timeout", "number"),
        "instance_expired_timeout": Map("controller.terminate_after", "number"),
        "send_cmd_retry_times": Map("controller.start_attempts", "int"),
        "instance_assemble_timeout": Unused(
            "Motor assembles once the nodes are registered; a start without READY is resent after "
            "controller.start_timeout plus the engine's startup_timeout"
        ),
        "instance_assembler_check_interval": Unused(CTRL_POLL),
        "instance_assembler_cmd_send_interval": Unused(CTRL_POLL),
        "instance_manager_check_interval": Unused(CTRL_POLL),
        "instance_assembler_check_internal": Unused(CTRL_POLL),
        "instance_assembler_cmd_send_internal": Unused(CTRL_POLL),
        "instance_manager_check_internal": Unused(CTRL_POLL),
    },
    "event_config": {
        "event_consumer_sleep_interval": Unused(EVENTS),
        "coordinator_heartbeat_interval": Unused(EVENTS),
    },
    "fault_tolerance_config": {
        "enable_fault_tolerance": Unused(
            "Motor's controller always acts on faults by level (L3/L4 restart, L5/L6 replace)"
        ),
        "enable_scale_p2d": Map("controller.scale_p2d", "bool"),
        "strategy_center_check_interval": Unused(CTRL_POLL),
        "strategy_center_check_internal": Unused(CTRL_POLL),
        "configmap_namespace": Unused(
            "no Kubernetes watch: hardware faults arrive as events (`motor fault report`)"
        ),
        "configmap_prefix": Unused(
            "no Kubernetes watch: hardware faults arrive as events (`motor fault report`)"
        ),
        "k8s_cert_path": Unused(K8S),
        "enable_token_reinference": Unused(STREAM_CONTINUE),
        "scale_p2d_d_instance_reinit_wait_timeout": Unused(NOT_MODELLED),
        "enable_dp_scale_down": Unused(_DP_SCALE),
        "enable_dp_scale_up": Unused(_DP_SCALE),
        "dp_scale_down_config": Free(None, _DP_SCALE),
    },
    "observability_config": Free(None, "the controller's /metrics is always on"),
    "standby_config": {
        "master_lock_ttl": Map("controller.lease_ttl", "number"),
        "enable_master_standby": Unused(STANDBY),
        "master_standby_check_interval": Unused(STANDBY),
        "master_lock_retry_interval": Unused(STANDBY),
        "master_lock_max_failures": Unused(STANDBY),
        "master_lock_key": Unused(STANDBY),
    },
    "etcd_config": ETCD_CONFIG,
    "mgmt_tls_config": TLS_CONFIG,
    "etcd_tls_config": TLS_CONFIG,
    "grpc_tls_config": TLS_CONFIG,
    "observability_tls_config": TLS_CONFIG,
    "port_allocator_config": PORT_ALLOCATOR,
    "precision_auto_recovery_enable": Unused(
        "the controller always isolates, restarts and clears a P/D group with a precision alarm"
    ),
    "logging_config": LOGGING_CONFIG,
    "additional_annotations": Free(None, K8S),
    "additional_labels": Free(None, K8S),
    "image_name": Unused(K8S),
}

_RESCHEDULE = Unused(STREAM_CONTINUE)
COORDINATOR: dict[str, Node] = {
    "api_config": {
        "coordinator_api_host": Map("coordinator.host", "str"),
        "coordinator_api_infer_port": Map("coordinator.port", "int"),
        "coordinator_api_mgmt_port": Map("coordinator.mgmt_port", "int"),
        "coordinator_obs_port": Unused("/metrics is served with the management API"),
        "coordinator_api_dns": Unused(K8S),
        "coordinator_api_infer_dns": Unused(K8S),
        "coordinator_api_obs_dns": Unused(K8S),
    },
    "exception_config": {
        "max_retry": Map("coordinator.retries", "int"),
        "transport_max_retry": Map("coordinator.retries (wins over max_retry when set)", "int"),
        "first_token_timeout": Map("coordinator.first_token_timeout", "number"),
        "infer_timeout": Map("coordinator.request_timeout", "number"),
        "retry_delay": Unused("a retry goes to another endpoint at once"),
        "upstream_error_body_max_bytes": Unused("engine error bodies are passed through as they are"),
        "reschedule_config": Free(None, STREAM_CONTINUE),
        "reschedule_enabled": _RESCHEDULE,
        "recompute_enabled": _RESCHEDULE,
        "recompute_max_retry": _RESCHEDULE,
    },
    "circuit_config": {
        "enable": Unused("circuit breakers are always on"),
        "failure_threshold": Map("coordinator.breaker.failures", "int"),
        "base_timeout_s": Map("coordinator.breaker.backoff_initial", "number"),
        "max_timeout_s": Map("coordinator.breaker.backoff_max", "number"),
    },
    "scheduler_config": {
        "scheduler_type": Map("coordinator.policy (load_balance, round_robin or kv_cache_affinity)", "str"),
        "enable_pd_separation_fallback_to_hybrid": Unused(
            "Motor routes to union (else prefill) instances when no P/D pair is routable"
        ),
        "endpoint_instance_score_weight": Unused(POLICY_INTERNALS),
        "dp_stats_window": Unused(POLICY_INTERNALS),
        "kv_affinity": Free(None, POLICY_INTERNALS),
        "kv_affinity_mode": Unused(POLICY_INTERNALS),
        "kv_affinity_load_weight": Unused(POLICY_INTERNALS),
        "kv_affinity_overlap_credit": Unused(POLICY_INTERNALS),
        "kv_affinity_prefill_load_scale": Unused(POLICY_INTERNALS),
        "kv_affinity_load_gate_topn": Unused(POLICY_INTERNALS),
    },
    "api_key_config": {
        "enable_api_key": Map("coordinator.api_keys (when true)", "bool"),
        "valid_keys": Map("coordinator.api_keys", "str_list"),
        "header_name": Unused("Motor reads `Authorization: Bearer <key>` and `x-api-key`"),
        "key_prefix": Unused("Motor reads `Authorization: Bearer <key>` and `x-api-key`"),
        "skip_paths": Unused("only /v1 paths take a key"),
        "encryption_algorithm": Unused("keys are compared as given"),
    },
    "mgmt_api_key_config": Free(None, NOT_MODELLED),
    "rate_limit_config": {
        "enable_rate_limit": Map("coordinator.rate_limit (when true)", "bool"),
        "max_requests": Map(
            "coordinator.rate_limit.burst, requests_per_second = max_requests / window_size", "int"
        ),
        "window_size": Map(
            "coordinator.rate_limit.requests_per_second = max_requests / window_size", "number"
        ),
        "max_request_body_size": Map("coordinator.max_body_bytes (MB, 0 = unlimited)", "number"),
        "provider": Unused("Motor's limiter is a token bucket"),
        "scope": Unused("Motor's limiter is per coordinator replica"),
        "skip_paths": Unused("only generation routes are limited"),
        "error_message": Unused("the 429 body is OpenAI-shaped"),
        "error_status_code": Unused("a refusal is always 429"),
        "olc_config_path": Unused(NOT_MODELLED),
    },
    "request_limit": {
        "max_requests": Map("coordinator.rate_limit.max_in_flight", "int"),
        "single_node_max_requests": Unused("per-engine limits come from the engine (max_num_seqs)"),
    },
    "token_sampling_config": {
        "precision_check_enabled": Map("coordinator.precision_detector.enabled", "bool"),
        "interval_seconds": Unused(NOT_MODELLED),
        "logprobs_count": Unused(NOT_MODELLED),
        "precision_issue_threshold": Unused(NOT_MODELLED),
        "probe_max_attempts": Unused(NOT_MODELLED),
        "probe_timeout_seconds": Unused(NOT_MODELLED),
    },
    "prometheus_metrics_config": {
        "reuse_time": Map("coordinator.engine_metrics_interval", "number"),
        "enable_kv_store_metrics": Unused(KV_POOL),
        "kv_store_metrics_endpoint": Unused(KV_POOL),
    },
    "timeout_config": Free(
        None, "connection timeouts: first_token_timeout and infer_timeout bound a request"
    ),
    "inference_workers_config": Free(None, "one asyncio process per coordinator replica; run more replicas"),
    "context_budget_mode": Unused(NOT_MODELLED),
    "render_config": Free(None, NOT_MODELLED),
    "token_obfuscation_config": Free(None, NOT_MODELLED),
    "tracer_config": Free(None, NOT_MODELLED),
    "prefill_kv_event_config": Free(None, KV_POOL),
    "aigw_model": Free(None, "/v1/models lists the served models known from the log"),
    "aigw": Free(None, "/v1/models lists the served models known from the log"),
    "standby_config": STANDBY_CONFIG,
    "etcd_config": ETCD_CONFIG,
    "infer_tls_config": TLS_CONFIG,
    "mgmt_tls_config": TLS_CONFIG,
    "etcd_tls_config": TLS_CONFIG,
    "port_allocator_config": PORT_ALLOCATOR,
    "logging_config": LOGGING_CONFIG,
    "_errors": Unused(DEPLOYER_RUNTIME),
    "worker_index": Unused(DEPLOYER_RUNTIME),
    "additional_annotations": Free(None, K8S),
    "additional_labels": Free(None, K8S),
    "image_name": Unused(K8S),
}

ENGINE_BLOCKS = {
    "motor_engine_prefill_config": "prefill",
    "motor_engine_decode_config": "decode",
    "motor_engine_union_config": "union",
}

USER_CONFIG: dict[str, Node] = {
    "version": Unused("format version"),
    "motor_deploy_config": DEPLOY,
    "motor_controller_config": CONTROLLER,
    "motor_coordinator_config": COORDINATOR,
    "motor_nodemanger_config": _nodemanager(nested=False),
    **{block: ENGINE_BLOCK for block in ENGINE_BLOCKS},
    "kv_cache_store_config": Free(None, KV_POOL),
    "kv_cache_pool_config": Free(None, KV_POOL),
    "kv_conductor_config": Free(None, KV_POOL),
    "mf_store_config": Free(None, KV_POOL),
}

# The blocks whose presence says "this is a MindIE-Motor user_config.json".
MINDIE_BLOCKS = frozenset(
    {"motor_deploy_config", "motor_controller_config", "motor_coordinator_config", "motor_nodemanger_config"}
    | set(ENGINE_BLOCKS)
    | {"motor_engine_encode_config"}
)

ENV_JSON: dict[str, Node] = {
    "version": Unused("format version"),
    "motor_common_env": Free("<role>.env of every engine section (the role's own block wins)"),
    "motor_engine_prefill_env": Free("prefill.env"),
    "motor_engine_decode_env": Free("decode.env"),
    "motor_engine_union_env": Free("union.env"),
    "motor_controller_env": Free(None, "Motor's controller needs no extra environment"),
    "motor_coordinator_env": Free(None, "Motor's coordinator needs no extra environment"),
    "motor_kv_cache_store_env": Free(None, KV_POOL),
    "motor_kv_cache_pool_env": Free(None, KV_POOL),
    "motor_kv_conductor_env": Free(None, KV_POOL),
    "motor_mf_store_env": Free(None, KV_POOL),
}
