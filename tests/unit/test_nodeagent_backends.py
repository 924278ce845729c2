"""Table tests pinning how each backend turns an engine section into a native command line."""

from typing import Any

import pytest

from core.config import EngineSection
from core.events import EndpointSpec, Role
from nodeagent.backends import backend_for
from nodeagent.backends import vllm as vllm_backend
from nodeagent.backends.launch import LaunchContext
from nodeagent.errors import StartupError


def section(**kw: Any) -> EngineSection:
    return EngineSection.model_validate(kw)


def ctx(sec: EngineSection, role: Role = Role.UNION, **kw: Any) -> LaunchContext:
    ep = kw.pop("endpoint", EndpointSpec(id=0, ip="10.0.0.5", business_port=9000, mgmt_port=9000))
    return LaunchContext(
        section=sec, role=role, instance_id=3, endpoint=ep, master_dp_ip="10.0.0.1", python="/py", **kw
    )


def flag(argv: tuple[str, ...], name: str) -> str | None:
    """The value after `name`, or None when the flag is absent."""
    if name not in argv:
        return None
    return argv[argv.index(name) + 1]


# --------------------------------------------------------------------------- capabilities


@pytest.mark.parametrize(
    ("kw", "role", "caps"),
    [
        ({"engine_type": "builtin"}, Role.PREFILL, ("handoff", "bootstrap")),
        ({"engine_type": "builtin", "dispatch_profile": "handoff"}, Role.DECODE, ("handoff",)),
        ({"engine_type": "builtin", "dispatch_profile": "bootstrap"}, Role.PREFILL, ("bootstrap",)),
        ({"engine_type": "sglang"}, Role.PREFILL, ("bootstrap",)),
        ({"engine_type": "sglang"}, Role.UNION, ("bootstrap",)),
        ({"engine_type": "vllm"}, Role.UNION, ()),
        (
            {
                "engine_type": "vllm",
                "engine_config": {"kv_transfer_config": {"kv_connector": "NixlConnector"}},
            },
            Role.PREFILL,
            ("handoff",),
        ),
        (
            {
                "engine_type": "vllm",
                "engine_config": {"kv_transfer_config": {"kv_connector": "p2pncclconnector"}},
            },
            Role.DECODE,
            ("handoff",),
        ),
        (
            {
                "engine_type": "vllm",
                "engine_config": {"kv_transfer_config": {"kv_connector": "MooncakeConnector"}},
            },
            Role.PREFILL,
            ("handoff",),
        ),
        (
            {
                "engine_type": "vllm",
                "engine_config": {"kv_transfer_config": {"kv_connector": "LMCacheConnectorV1"}},
            },
            Role.PREFILL,
            ("handoff",),
        ),
        (
            {
                "engine_type": "vllm",
                "engine_config": {"kv_transfer_config": {"kv_connector": "ExampleConnector"}},
            },
            Role.DECODE,
            ("handoff",),
        ),
        (
            {
                "engine_type": "vllm",
                "engine_config": {
                    "kv_transfer_config": {
                        "kv_connector": "MultiConnector",
                        "kv_connector_extra_config": {
                            "connectors": [
                                {"kv_connector": "NixlConnector"},
                                {"kv_connector": "LMCacheConnectorV1"},
                            ]
                        },
                    }
                },
            },
            Role.PREFILL,
            ("handoff",),
        ),
        (
            {
                "engine_type": "vllm",
                "dispatch_profile": "handoff",
                "engine_config": {"kv_transfer_config": {"kv_connector": "MyConnector"}},
            },
            Role.PREFILL,
            ("handoff",),
        ),
        # A store connector on a union engine has no P/D role: no capability, no failure.
        (
            {
                "engine_type": "vllm",
                "engine_config": {"kv_transfer_config": {"kv_connector": "AscendStoreConnector"}},
            },
            Role.UNION,
            (),
        ),
    ],
)
def test_capabilities(kw: dict[str, Any], role: Role, caps: tuple[str, ...]) -> None:
    sec = section(**kw)
    assert backend_for(sec.engine_type).capabilities(sec, role) == caps


@pytest.mark.parametrize(
    ("kw", "role", "needle"),
    [
        (
            {"engine_type": "vllm", "engine_config": {"kv_transfer_config": {"kv_connector": "MyConnector"}}},
            Role.PREFILL,
            "'MyConnector'",
        ),
        (
            {
                "engine_type": "vllm",
                "engine_config": {
                    "kv_transfer_config": {
                        "kv_connector": "MultiConnector",
                        "connectors": [{"kv_connector": "Weird"}],
                    }
                },
            },
            Role.DECODE,
            "'Weird'",
        ),
        ({"engine_type": "vllm"}, Role.PREFILL, "kv_transfer_config.kv_connector"),
        ({"engine_type": "vllm", "dispatch_profile": "trigger"}, Role.PREFILL, "handoff protocol only"),
        ({"engine_type": "sglang", "dispatch_profile": "handoff"}, Role.PREFILL, "bootstrap protocol"),
        ({"engine_type": "builtin", "dispatch_profile": "trigger"}, Role.PREFILL, "'trigger'"),
        (
            {
                "engine_type": "vllm",
                "engine_config": {"kv_transfer_config": {"kv_connector": "MultiConnector"}},
            },
            Role.PREFILL,
            "connectors[0]",
        ),
    ],
)
def test_capabilities_fail_closed(kw: dict[str, Any], role: Role, needle: str) -> None:
    sec = section(**kw)
    with pytest.raises(StartupError, match=None) as err:
        backend_for(sec.engine_type).capabilities(sec, role)
    assert needle in str(err.value)


def test_unknown_engine_type() -> None:
    with pytest.raises(StartupError, match="tensorrt"):
        backend_for("tensorrt")


# --------------------------------------------------------------------------- vLLM


def test_vllm_union_command_line() -> None:
    sec = section(
        engine_type="vllm",
        model="qwen3",
        model_path="/models/Qwen3-8B",
        engine_config={
            "tensor_parallel_size": 2,
            "max-model-len": 8192,
            "enforce_eager": True,
            "enable_prefix_caching": False,
            "quantization": None,
        },
    )
    spec = backend_for("vllm").launch(ctx(sec))
    assert spec.argv == (
        "vllm",
        "serve",
        "/models/Qwen3-8B",
        "--served-model-name",
        "qwen3",
        "--host",
        "10.0.0.5",
        "--port",
        "9000",
        "--tensor-parallel-size",
        "2",
        "--max-model-len",
        "8192",
        "--enforce-eager",
    )
    assert spec.serves_http


def test_vllm_model_defaults_to_served_name_and_launcher_overrides_program() -> None:
    sec = section(
        engine_type="vllm", model="m", launcher=["/venv/bin/python", "-m", "vllm.entrypoints.cli.main"]
    )
    argv = backend_for("vllm").launch(ctx(sec)).argv
    assert argv[:5] == ("/venv/bin/python", "-m", "vllm.entrypoints.cli.main", "serve", "m")


@pytest.mark.parametrize(
    ("connector", "role", "kv_role"),
    [
        ("P2pNcclConnector", Role.PREFILL, "kv_producer"),
        ("P2pNcclConnector", Role.DECODE, "kv_consumer"),
        ("MooncakeConnector", Role.PREFILL, "kv_producer"),
        ("NixlConnector", Role.PREFILL, "kv_producer"),
        ("NixlConnector", Role.DECODE, "kv_consumer"),
        ("ExampleConnector", Role.DECODE, "kv_both"),
        ("LMCacheConnectorV1", Role.UNION, "kv_both"),
    ],
)
def test_vllm_kv_role_by_role_and_connector(connector: str, role: Role, kv_role: str) -> None:
    sec = section(engine_type="vllm", engine_config={"kv_transfer_config": {"kv_connector": connector}})
    argv = backend_for("vllm").launch(ctx(sec, role)).argv
    assert flag(argv, "--kv-transfer-config") == f'{{"kv_connector":"{connector}","kv_role":"{kv_role}"}}'


def test_vllm_user_kv_role_kept_and_multiconnector_first_gets_role() -> None:
    sec = section(
        engine_type="vllm",
        engine_config={
            "kv_transfer_config": {
                "kv_connector": "MultiConnector",
                "kv_connector_extra_config": {
                    "connectors": [
                        {"kv_connector": "P2pNcclConnector"},
                        {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"},
                    ]
                },
            }
        },
    )
    ktc = vllm_backend.kv_transfer_config(sec, Role.DECODE)
    assert ktc is not None
    assert ktc["kv_role"] == "kv_consumer"
    assert ktc["kv_connector_extra_config"]["connectors"][0]["kv_role"] == "kv_consumer"
    assert ktc["kv_connector_extra_config"]["connectors"][1]["kv_role"] == "kv_both"
    mine = section(
        engine_type="vllm",
        engine_config={"kv_transfer_config": {"kv_connector": "P2pNcclConnector", "kv_role": "kv_both"}},
    )
    assert vllm_backend.kv_transfer_config(mine, Role.PREFILL) == {
        "kv_connector": "P2pNcclConnector",
        "kv_role": "kv_both",
    }


def test_vllm_data_parallel_rank_per_endpoint() -> None:
    sec = section(
        engine_type="vllm",
        engine_config={
            "nnodes": 2,
            "data_parallel_size": 4,
            "data_parallel_size_local": 2,
            "data_parallel_rpc_port": 13345,
        },
    )
    ep = EndpointSpec(id=1, ip="10.0.0.6", business_port=9001, mgmt_port=9001, dp_rank=3)
    argv = backend_for("vllm").launch(ctx(sec, endpoint=ep, node_rank=1, nnodes=2)).argv
    assert flag(argv, "--data-parallel-size") == "4"
    assert flag(argv, "--data-parallel-rank") == "3"
    assert flag(argv, "--data-parallel-address") == "10.0.0.1"
    assert flag(argv, "--data-parallel-rpc-port") == "13345"
    # DP alone spans the nodes: nnodes is Motor's key, not a vLLM multi-node launch.
    for absent in ("--nnodes", "--node-rank", "--headless", "--master-addr", "--data-parallel-size-local"):
        assert absent not in argv


@pytest.mark.parametrize(("node_rank", "headless"), [(0, False), (1, True)])
def test_vllm_multi_node_tp_pp(node_rank: int, headless: bool) -> None:
    sec = section(
        engine_type="vllm",
        engine_config={
            "tensor_parallel_size": 16,
            "pipeline_parallel_size": 2,
            "nnodes": 2,
            "master-port": 7060,
        },
    )
    spec = backend_for("vllm").launch(ctx(sec, node_rank=node_rank, nnodes=2))
    argv = spec.argv
    assert flag(argv, "--nnodes") == "2"
    assert flag(argv, "--node-rank") == str(node_rank)
    assert flag(argv, "--master-addr") == "10.0.0.1"
    assert flag(argv, "--master-port") == "7060"
    assert ("--headless" in argv) is headless
    assert spec.serves_http is not headless


def test_vllm_motor_keys_not_passed_through() -> None:
    sec = section(
        engine_type="vllm",
        engine_config={"disaggregation_bootstrap_port": 8998, "node_rank": 5, "headless": True, "model": "x"},
    )
    argv = backend_for("vllm").launch(ctx(sec)).argv
    for absent in ("--disaggregation-bootstrap-port", "--node-rank", "--headless", "--model"):
        assert absent not in argv


# --------------------------------------------------------------------------- SGLang


@pytest.mark.parametrize(
    ("role", "mode"), [(Role.PREFILL, "prefill"), (Role.DECODE, "decode"), (Role.UNION, "null")]
)
def test_sglang_command_line(role: Role, mode: str) -> None:
    sec = section(
        engine_type="sglang",
        model="qwen3",
        model_path="/models/Qwen3-8B",
        engine_config={"tp_size": 2, "disaggregation_transfer_backend": "mooncake"},
    )
    boot = 8998 if role == Role.PREFILL else None
    ep = EndpointSpec(id=0, ip="10.0.0.5", business_port=9000, mgmt_port=9000, bootstrap_port=boot)
    argv = backend_for("sglang").launch(ctx(sec, role, endpoint=ep)).argv
    assert argv[:3] == ("python3", "-m", "sglang.launch_server")
    assert flag(argv, "--model-path") == "/models/Qwen3-8B"
    assert flag(argv, "--served-model-name") == "qwen3"
    assert flag(argv, "--port") == "9000"
    assert flag(argv, "--tp-size") == "2"
    assert flag(argv, "--disaggregation-mode") == mode
    assert flag(argv, "--disaggregation-bootstrap-port") == (str(boot) if boot else None)
    assert "--enable-metrics" in argv


def test_sglang_multi_node() -> None:
    sec = section(engine_type="sglang", engine_config={"nnodes": 2, "tp_size": 16, "dist_init_port": 5757})
    spec = backend_for("sglang").launch(ctx(sec, node_rank=1, nnodes=2))
    assert flag(spec.argv, "--dist-init-addr") == "10.0.0.1:5757"
    assert flag(spec.argv, "--node-rank") == "1"
    assert "--dist-init-port" not in spec.argv
    assert not spec.serves_http


# --------------------------------------------------------------------------- builtin


def test_builtin_command_line() -> None:
    sec = section(
        engine_type="builtin",
        model="motor-sim",
        engine_config={
            "max_model_len": 4096,
            "num_gpu_blocks": 1024,
            "fast": True,
            "tensor_parallel_size": 2,
            "kv_transfer_config": {"kv_connector": "X"},
        },
    )
    ep = EndpointSpec(id=0, ip="127.0.0.1", business_port=9000, mgmt_port=9000, bootstrap_port=9001)
    argv = backend_for("builtin").launch(ctx(sec, Role.PREFILL, endpoint=ep)).argv
    assert argv == (
        "/py",
        "-m",
        "simengine",
        "--host",
        "127.0.0.1",
        "--port",
        "9000",
        "--role",
        "prefill",
        "--model",
        "motor-sim",
        "--max-model-len",
        "4096",
        "--num-blocks",
        "1024",
        "--fast",
        "--bootstrap-port",
        "9001",
    )


def test_builtin_launcher_replaces_the_program_as_for_every_engine() -> None:
    sec = section(engine_type="builtin", launcher=["/other/python", "-m", "simengine"])
    argv = backend_for("builtin").launch(ctx(sec)).argv
    assert argv[:5] == ("/other/python", "-m", "simengine", "--host", "10.0.0.5")


@pytest.mark.parametrize(
    ("kw", "capacity"),
    [
        (
            {"engine_type": "builtin", "engine_config": {"num_gpu_blocks": 1024, "max_model_len": 4096}},
            (4096, 256, 1024, 16),
        ),
        (
            {
                "engine_type": "vllm",
                "engine_config": {"max_model_len": 8192, "max_num_seqs": 64, "block_size": 128},
            },
            (8192, 64, 1024, 128),
        ),
        (
            {
                "engine_type": "sglang",
                "engine_config": {
                    "context_length": 32768,
                    "max_running_requests": 48,
                    "page_size": 64,
                    "max_total_tokens": 65536,
                },
            },
            (32768, 48, 1024, 64),
        ),
    ],
)
def test_capacity(kw: dict[str, Any], capacity: tuple[int, int, int, int]) -> None:
    sec = section(**kw)
    c = backend_for(sec.engine_type).capacity(sec)
    assert (c.max_seq_len, c.total_slots, c.total_blocks, c.block_size) == capacity


def test_bad_integer_option_names_the_key() -> None:
    sec = section(engine_type="vllm", engine_config={"max_model_len": "lots"})
    with pytest.raises(StartupError, match=r"engine_config\.max_model_len"):
        backend_for("vllm").capacity(sec)
