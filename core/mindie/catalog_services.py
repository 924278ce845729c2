"""The catalog of `motor_controller_config` and `motor_coordinator_config`."""

from __future__ import annotations

from core.mindie.fields import (
    CTRL_POLL,
    DEPLOYER_RUNTIME,
    ETCD_CONFIG,
    EVENTS,
    K8S,
    KV_POOL,
    LOGGING_CONFIG,
    NOT_MODELLED,
    POLICY_INTERNALS,
    PORT_ALLOCATOR,
    STANDBY,
    STANDBY_CONFIG,
    STREAM_CONTINUE,
    TLS_CONFIG,
    Free,
    Map,
    Node,
    Unused,
)

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
