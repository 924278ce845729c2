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

from core.mindie.catalog_services import CONTROLLER, COORDINATOR
from core.mindie.fields import (
    DERIVED,
    K8S,
    KV_POOL,
    LOGGING_CONFIG,
    NM_PER_ROLE,
    NM_REMOTE,
    PORT_ALLOCATOR,
    TLS_CONFIG,
    VIRTUAL,
    Free,
    Map,
    Node,
    Unused,
)

__all__ = [
    "ENGINE_BLOCK",
    "ENGINE_BLOCKS",
    "ENV_JSON",
    "MINDIE_BLOCKS",
    "USER_CONFIG",
    "Free",
    "Map",
    "Node",
    "Unused",
]


FAULT_TOLERANCE: dict[str, Node] = {
    "enable_fault_tolerance": Map(
        "<role>.fault_tolerance.enabled (true forces it on; false leaves the engine's FT flag in charge)",
        "bool",
    ),
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
