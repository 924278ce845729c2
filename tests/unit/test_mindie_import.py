"""MindIE-Motor user_config.json (+ env.json) -> Motor: the fixtures of tests/data/mindie, field
errors by JSON path, legacy flattening, the doc table, one-machine ports."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson
import pytest

from core.config import ClusterConfig, EngineSection
from core.configfile import parse_config
from core.errors import ConfigError
from core.events import EndpointSpec, Role
from core.mindie import config_from_mindie, import_mindie, is_mindie
from core.mindie.catalog import ENGINE_BLOCK, USER_CONFIG, Map
from core.mindie.catalog_doc import render_table
from deploy.cluster import LocalCluster
from deploy.localports import one_machine_ports
from nodeagent.backends import backend_for
from nodeagent.backends.launch import LaunchContext, LaunchSpec

DATA = Path(__file__).resolve().parents[1] / "data" / "mindie"
DOC = Path(__file__).resolve().parents[2] / "docs" / "mindie-config.md"


def load(name: str, env: bool = True) -> tuple[ClusterConfig, Any]:
    user = orjson.loads((DATA / name / "user_config.json").read_bytes())
    env_file = DATA / name / "env.json"
    env_raw = orjson.loads(env_file.read_bytes()) if env and env_file.exists() else None
    return config_from_mindie(user, env_raw, f"{name}/user_config.json")


def launch(
    sec: EngineSection, role: Role, *, dp_rank: int = 0, node_rank: int = 0, nnodes: int = 1
) -> LaunchSpec:
    ep = EndpointSpec(
        id=dp_rank, ip="10.0.0.5", business_port=10000 + dp_rank, mgmt_port=10000, dp_rank=dp_rank
    )
    ctx = LaunchContext(
        section=sec,
        role=role,
        instance_id=1,
        endpoint=ep,
        master_dp_ip="10.0.0.1",
        node_rank=node_rank,
        nnodes=nnodes,
        environ={},
    )
    return backend_for(sec.engine_type).launch(ctx)


def flag(argv: tuple[str, ...], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


# --------------------------------------------------------------------------- the fixtures


def test_pd_fixture_gives_a_vllm_2p1d_cluster() -> None:
    cfg, imported = load("pd")
    assert set(cfg.sections()) == {Role.PREFILL, Role.DECODE}
    assert cfg.prefill is not None and cfg.decode is not None
    assert (cfg.prefill.instances, cfg.decode.instances) == (2, 1)
    plan = LocalCluster(cfg).node_plan()
    assert [p.role for p in plan] == [Role.PREFILL, Role.PREFILL, Role.DECODE]

    p = launch(cfg.prefill, Role.PREFILL).argv
    assert p[:3] == ("vllm", "serve", "/mnt/weight/qwen3_8B") and "--model" not in p
    assert flag(p, "--served-model-name") == "qwen3-8B"
    assert flag(p, "--tensor-parallel-size") == "8" and flag(p, "--gpu-memory-utilization") == "0.9"
    assert orjson.loads(flag(p, "--kv-transfer-config") or "")["kv_role"] == "kv_producer"
    d = launch(cfg.decode, Role.DECODE, dp_rank=1).argv
    assert (flag(d, "--data-parallel-size"), flag(d, "--data-parallel-rank")) == ("2", "1")
    assert "--enable-fault-tolerance" in d  # the engine's own flag passes through

    hp, hd = cfg.prefill.health_check_config, cfg.decode.health_check_config
    assert (hp.timeout, hp.retry_attempts, hp.startup_timeout) == (5, 3, 1800)
    assert (hd.timeout, hd.retry_attempts, hd.startup_timeout) == (10, 2, 900)
    assert not cfg.prefill.fault_reporter_on()  # fault_tolerance_config.enable_fault_tolerance: false
    assert cfg.decode.fault_reporter_on()  # engine_config.enable_fault_tolerance: true
    assert (cfg.decode.fault_tolerance.poll_interval, cfg.decode.fault_tolerance.poll_timeout) == (2.0, 5.0)
    snap = cfg.decode.snapshot
    assert snap.enabled and snap.metadata_file() == "/snapshot/decode/snapshot_metadata.json"
    assert snap.namespace == "mindie-motor" and not cfg.prefill.snapshot.enabled
    assert (
        cfg.prefill.env["HCCL_BUFFSIZE"] == "200"
        and cfg.prefill.env["CANN_INSTALL_PATH"] == "/usr/local/Ascend"
    )
    assert cfg.decode.env["MOTOR_LOG_ROOT_PATH"] == "/var/log/decode"  # the role's env wins over common
    assert cfg.prefill.dispatch_profile == "handoff" and cfg.prefill.devices_per_node == 8

    co = cfg.coordinator
    assert (co.port, co.mgmt_port, co.retries, co.request_timeout) == (1025, 1026, 5, 3600)
    assert (co.policy.prefill, co.policy.decode) == ("prefix_affinity", "least_load")
    assert co.api_keys == ["sk-motor-test"] and co.precision_detector.enabled
    assert (co.rate_limit.requests_per_second, co.rate_limit.burst, co.rate_limit.max_in_flight) == (
        20.0,
        1200,
        10000,
    )
    assert co.max_body_bytes == 2 * 1024 * 1024 and co.engine_metrics_interval == 3
    ctl = cfg.controller
    assert (ctl.heartbeat_timeout, ctl.terminate_after, ctl.start_attempts, ctl.lease_ttl) == (
        10,
        1200,
        3,
        15,
    )
    assert (
        ctl.scale_p2d and cfg.nodeagent.heartbeat_interval == 3 and cfg.nodeagent.job_name == "mindie-motor"
    )

    report = "\n".join(imported.unused_report())
    for path in (
        "motor_deploy_config.image_name",
        "motor_engine_prefill_config.health_check_config.enable_virtual_inference",
        "motor_controller_config.etcd_config",
        "env.json:motor_kv_conductor_env",
    ):
        assert report.count(path) == 1, path  # each unused field is reported once, with a reason
    assert "not consumed by native engines (seed 002)" in report


def test_hybrid_fixture_gives_sglang_union_instances() -> None:
    cfg, _ = load("hybrid")
    assert set(cfg.sections()) == {Role.UNION} and cfg.union is not None
    assert cfg.union.instances == 3 and len(LocalCluster(cfg).node_plan()) == 3
    argv = launch(cfg.union, Role.UNION).argv
    assert argv[:3] == ("python3", "-m", "sglang.launch_server")
    assert flag(argv, "--model-path") == "/mnt/share/weight/Qwen3-8B"
    assert flag(argv, "--served-model-name") == "qwen3-8B"
    assert flag(argv, "--disaggregation-mode") == "null"
    assert flag(argv, "--tp-size") == "2" and "--enable-metrics" in argv
    hc = cfg.union.health_check_config
    assert (hc.timeout, hc.retry_attempts, hc.startup_timeout) == (5.0, 3, 1800.0)  # seed defaults
    assert cfg.union.fault_reporter_on() and cfg.union.fault_tolerance.poll_interval == 3.0
    assert cfg.union.env["ASCEND_BUFFER_POOL"] == "0:0" and cfg.union.env["OMP_NUM_THREADS"] == "100"
    assert cfg.coordinator.policy.union == "round_robin" and cfg.coordinator.rate_limit.max_in_flight == 512


def test_multinode_fixture_spans_nodes_per_instance() -> None:
    cfg, _ = load("multinode")
    assert cfg.prefill is not None and cfg.decode is not None
    assert cfg.prefill.nodes_per_instance() == 2 and cfg.decode.nodes_per_instance() == 2
    assert [p.role.value for p in LocalCluster(cfg).node_plan()] == ["prefill"] * 2 + ["decode"] * 2
    # Prefill: TP16 x PP2 over two nodes (nnodes + master-port): rank 1 is a headless follower.
    lead = launch(cfg.prefill, Role.PREFILL, node_rank=0, nnodes=2)
    follower = launch(cfg.prefill, Role.PREFILL, node_rank=1, nnodes=2)
    assert flag(lead.argv, "--nnodes") == "2" and "--headless" not in lead.argv and lead.serves_http
    assert flag(follower.argv, "--node-rank") == "1" and flag(follower.argv, "--master-addr") == "10.0.0.1"
    assert "--headless" in follower.argv and not follower.serves_http
    # Decode: DP4 over two pods, two DP ranks a node; nnodes is Motor's topology only.
    assert cfg.decode.endpoints_per_node() == 2
    d = launch(cfg.decode, Role.DECODE, dp_rank=3).argv
    assert (flag(d, "--data-parallel-size"), flag(d, "--data-parallel-rank")) == ("4", "3")
    assert "--nnodes" not in d
    assert cfg.coordinator.retries == 2  # transport_max_retry wins over max_retry
    assert cfg.nodeagent.job_name == "glm5-bigep-nm"  # basic_config.job_name wins over job_id


def test_detection_by_top_level_blocks_and_parse_config_maps_it() -> None:
    text = (DATA / "hybrid" / "user_config.json").read_bytes()
    assert is_mindie(orjson.loads(text)) and not is_mindie({"union": {"instances": 1}})
    cfg = parse_config(text, "user_config.json")
    assert cfg.union is not None and cfg.union.engine_type == "sglang"


def test_legacy_model_and_parallel_config_are_flattened_engine_config_wins() -> None:
    user = {
        "motor_engine_union_config": {
            "engine_type": "vllm",
            "model_config": {"model_name": "ds", "model_path": "/w/ds", "npu_mem_utils": 0.8},
            "parallel_config": {"dp_size": 2, "tp_size": 8, "enable_ep": True},
            "engine_config": {"tensor-parallel-size": 4},
        }
    }
    cfg, _ = config_from_mindie(user)
    assert cfg.union is not None
    assert (cfg.union.model, cfg.union.model_path) == ("ds", "/w/ds")
    ec = cfg.union.engine_config
    assert ec["gpu_memory_utilization"] == 0.8 and ec["data_parallel_size"] == 2
    assert ec["enable_expert_parallel"] is True
    assert ec["tensor-parallel-size"] == 4 and "tensor_parallel_size" not in ec


def test_explicit_false_fault_tolerance_does_not_turn_off_the_engines_flag() -> None:
    # Seed 002: the node manager's switch defaults to false and is turned on by the engine's FT.
    block = {
        "engine_type": "vllm",
        "engine_config": {"enable_fault_tolerance": True},
        "motor_nodemanger_config": {"fault_tolerance_config": {"enable_fault_tolerance": False}},
    }
    cfg, _ = config_from_mindie({"motor_engine_union_config": block})
    assert cfg.union is not None and cfg.union.fault_reporter_on()
    block["engine_config"] = {}
    cfg, _ = config_from_mindie({"motor_engine_union_config": block})
    assert cfg.union is not None and not cfg.union.fault_reporter_on()


# --------------------------------------------------------------------------- errors by path


UNION = {"engine_type": "vllm", "engine_config": {"served_model_name": "m", "model": "/w"}}


@pytest.mark.parametrize(
    ("user", "env", "message"),
    [
        (
            {"motor_engine_union_config": {**UNION, "health_check_config": {"timeout": 3}}},
            None,
            "motor_engine_union_config.health_check_config.timeout: unknown field",
        ),
        (
            {
                "motor_engine_union_config": {
                    **UNION,
                    "health_check_config": {"health_collector_timeout": "5"},
                }
            },
            None,
            "motor_engine_union_config.health_check_config.health_collector_timeout: must be a number, got '5'",
        ),
        (
            {"motor_engine_union_config": {**UNION, "health_check_config": {"health_collector_timeout": 0}}},
            None,
            "motor_engine_union_config.health_check_config.health_collector_timeout: Input should be greater than 0",
        ),
        ({"motor_deploy_config": {"p_instances_num": 1}}, None, "no engine block"),
        (
            {"motor_deploy_config": {"p_instances_num": 2}, "motor_engine_union_config": UNION},
            None,
            "motor_deploy_config.p_instances_num: 2 prefill instances, but no motor_engine_prefill_config",
        ),
        ({"motor_engine_decode_config": UNION}, None, "a decode block needs motor_engine_prefill_config"),
        ({"motor_engine_union_config": UNION, "motor_engine_encode_config": UNION}, None, "encode"),
        (
            {"motor_engine_union_config": {"engine_config": {}}},
            None,
            "motor_engine_union_config.engine_type: is required",
        ),
        (
            {"motor_engine_union_config": {**UNION, "engine_type": "trtllm"}},
            None,
            "motor_engine_union_config.engine_type: must be one of vllm, sglang, builtin",
        ),
        (
            {
                "motor_deploy_config": {"single_hybrid_instance_pod_num": 2},
                "motor_engine_union_config": {**UNION, "engine_config": {"nnodes": 4}},
            },
            None,
            "single_hybrid_instance_pod_num: 2 nodes per instance, but motor_engine_union_config.engine_config.nnodes is 4",
        ),
        (
            {
                "motor_engine_union_config": UNION,
                "motor_coordinator_config": {"scheduler_config": {"scheduler_type": "x"}},
            },
            None,
            "motor_coordinator_config.scheduler_config.scheduler_type: must be one of load_balance",
        ),
        (
            {
                "motor_engine_union_config": UNION,
                "motor_coordinator_config": {"api_key_config": {"enable_api_key": True}},
            },
            None,
            "api_key_config.valid_keys: enable_api_key is true but no key is listed",
        ),
        (
            {"motor_engine_union_config": UNION},
            {"motor_engine_foo_env": {}},
            "env.json: motor_engine_foo_env: unknown field",
        ),
        (
            {"motor_engine_union_config": UNION},
            {"motor_engine_union_env": {"A": {"b": 1}}},
            "env.motor_engine_union_env.A: must be a string or a number",
        ),
        (
            {"motor_engine_union_config": UNION, "motor_deploy_config": []},
            None,
            "motor_deploy_config: must be an object",
        ),
        (
            {"motor_engine_union_config": {**UNION, "engine_config": "x"}},
            None,
            "motor_engine_union_config.engine_config: must be an object",
        ),
    ],
)
def test_bad_config_names_the_seed_field(user: dict[str, Any], env: Any, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_mindie(user, env)
    assert message in str(err.value)


def _map_paths(tree: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for key, node in tree.items():
        if isinstance(node, dict):
            out += _map_paths(node, f"{prefix}{key}.")
        elif isinstance(node, Map):
            out.append(prefix + key)
    return out


MAPPED = [
    p for p in _map_paths(USER_CONFIG) if not p.startswith(("motor_engine_prefill", "motor_engine_decode"))
]


@pytest.mark.parametrize("path", MAPPED)
def test_every_mapped_field_of_the_wrong_type_is_an_error_naming_it(path: str) -> None:
    user: dict[str, Any] = {"motor_engine_union_config": copy.deepcopy(UNION)}
    node = user
    *parents, leaf = path.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = {"not": "a scalar"}
    with pytest.raises(ConfigError) as err:
        config_from_mindie(user)
    assert f"{path}: must be" in str(err.value)


def test_unknown_top_level_block_is_an_error_listing_the_known_ones() -> None:
    with pytest.raises(ConfigError) as err:
        import_mindie({"motor_engine_union_config": UNION, "motor_scheduler_config": {}})
    assert "motor_scheduler_config: unknown field (known here:" in str(err.value)
    assert "motor_deploy_config" in str(err.value)


# --------------------------------------------------------------------------- doc, ports


def test_the_doc_table_is_the_catalog() -> None:
    assert render_table() in DOC.read_text(), "regenerate with `python -m core.mindie.catalog_doc`"
    assert set(ENGINE_BLOCK) <= {
        line.split("`")[1].split(".")[1]
        for line in render_table().splitlines()[2:]
        if line.startswith("| `motor_engine_*")
    }


def test_one_machine_ports_move_what_overlaps_and_keep_the_coordinator() -> None:
    cfg, _ = load("pd")
    moved, notes = one_machine_ports(cfg, nodes=3)
    assert (moved.coordinator.port, moved.coordinator.mgmt_port) == (1025, 1026)
    assert moved.controller.port == 8100 and moved.nodeagent.port_base == 8200
    assert moved.nodeagent.engine_port_base == 10000
    assert any("controller.port 1026" in n for n in notes) and len(notes) == 2
    same, none = one_machine_ports(ClusterConfig.model_validate({"union": {}}), nodes=2)
    assert none == [] and same.controller.port == 8100
