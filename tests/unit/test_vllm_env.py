"""Table tests for the per-endpoint environment of a real vLLM engine (nodeagent/backends/vllm_env)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest

from core.config import EngineSection
from core.configfile import parse_config
from core.events import EndpointSpec, Role
from nodeagent.backends import backend_for
from nodeagent.backends.launch import LaunchContext

NIXL_CPU = {"kv_connector": "NixlConnector", "kv_buffer_device": "cpu"}


def launch_env(
    role: Role = Role.UNION, *, bootstrap: int | None = None, port: int = 9000, **kw: Any
) -> tuple[dict[str, str], tuple[str, ...]]:
    sec = EngineSection.model_validate({"engine_type": "vllm", "model": "tiny", **kw})
    ep = EndpointSpec(id=0, ip="127.0.0.1", business_port=port, mgmt_port=port, bootstrap_port=bootstrap)
    spec = backend_for("vllm").launch(
        LaunchContext(section=sec, role=role, instance_id=1, endpoint=ep, master_dp_ip="127.0.0.1")
    )
    return spec.env, spec.dirs


def test_each_endpoint_gets_its_own_socket_and_cache_dirs() -> None:
    env, dirs = launch_env(port=9000)
    other, _ = launch_env(port=9001)
    root = f"{tempfile.gettempdir()}/motor-vllm/127.0.0.1-9000"
    assert env["VLLM_RPC_BASE_PATH"] == f"{root}/rpc"
    assert env["VLLM_CACHE_ROOT"] == f"{root}/cache"
    assert dirs == (f"{root}/rpc", f"{root}/cache")
    assert other["VLLM_RPC_BASE_PATH"] != env["VLLM_RPC_BASE_PATH"]


def test_socket_dir_leaves_room_for_zmq_ipc_names() -> None:
    # ipc://<base>/<uuid4>: a Unix socket path holds at most 107 bytes.
    env, _ = launch_env(port=65000)
    assert len(env["VLLM_RPC_BASE_PATH"]) + 1 + 36 < 107


@pytest.mark.parametrize(
    ("model_path", "offline"),
    [
        ("/models/tiny", True),
        ("./tiny", True),
        (".models/tiny", True),
        ("~/m", True),
        ("Qwen/Qwen3-8B", False),
        (None, False),
    ],
)
def test_local_model_path_turns_the_hub_off(model_path: str | None, offline: bool) -> None:
    env, _ = launch_env(model_path=model_path)
    assert ("HF_HUB_OFFLINE" in env) is offline


@pytest.mark.parametrize(
    ("ktc", "bootstrap", "port", "expect"),
    [
        (NIXL_CPU, None, 9000, {"VLLM_NIXL_SIDE_CHANNEL_PORT": "19000", "UCX_TLS": "tcp,self"}),
        (NIXL_CPU, 7100, 9000, {"VLLM_NIXL_SIDE_CHANNEL_PORT": "7100", "UCX_TLS": "tcp,self"}),
        (NIXL_CPU, None, 60000, {"VLLM_NIXL_SIDE_CHANNEL_PORT": "50000"}),
        ({"kv_connector": "NixlConnector"}, None, 9000, {"VLLM_NIXL_SIDE_CHANNEL_PORT": "19000"}),
        (
            {"kv_connector": "MultiConnector", "kv_connector_extra_config": {"connectors": [NIXL_CPU]}},
            None,
            9000,
            {"VLLM_NIXL_SIDE_CHANNEL_PORT": "19000"},
        ),
    ],
)
def test_nixl_side_channel_per_endpoint(
    ktc: dict[str, Any], bootstrap: int | None, port: int, expect: dict[str, str]
) -> None:
    env, _ = launch_env(
        Role.PREFILL, bootstrap=bootstrap, port=port, engine_config={"kv_transfer_config": ktc}
    )
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert {k: env.get(k) for k in expect} == expect
    if ktc.get("kv_buffer_device") != "cpu":
        assert "UCX_TLS" not in env  # a GPU node picks its own transports


def test_no_nixl_variables_without_nixl() -> None:
    env, _ = launch_env(
        Role.DECODE,
        engine_config={"kv_transfer_config": {"kv_connector": "ExampleConnector"}},
    )
    assert not any(k.startswith(("VLLM_NIXL", "UCX")) for k in env)


def test_the_sections_env_wins_and_its_dirs_are_not_created() -> None:
    env, dirs = launch_env(
        env={"VLLM_RPC_BASE_PATH": "/run/mine", "UCX_TLS": "rc,tcp"},
        engine_config={"kv_transfer_config": NIXL_CPU},
    )
    assert "VLLM_RPC_BASE_PATH" not in env and "UCX_TLS" not in env
    assert dirs == (env["VLLM_CACHE_ROOT"],)


@pytest.mark.parametrize("name", ["vllm-cpu.yaml", "vllm-cpu-pd.yaml"])
def test_cpu_example_configs_launch_the_vllm_venv_offline(name: str) -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / name
    cfg = parse_config(path.read_text(), str(path))
    for role, sec in cfg.sections().items():
        ep = EndpointSpec(id=0, ip="127.0.0.1", business_port=9000, mgmt_port=9000)
        spec = backend_for("vllm").launch(
            LaunchContext(section=sec, role=role, instance_id=1, endpoint=ep, master_dp_ip="127.0.0.1")
        )
        assert spec.argv[:4] == (".venv-vllm/bin/python", "-m", "vllm.entrypoints.cli.main", "serve")
        assert spec.env["HF_HUB_OFFLINE"] == "1"
        assert "--enforce-eager" in spec.argv
        assert sec.env["VLLM_CPU_KVCACHE_SPACE"] == "1"
        if role != Role.UNION:
            ktc = spec.argv[spec.argv.index("--kv-transfer-config") + 1]
            assert '"kv_connector":"ExampleConnector"' in ktc and '"kv_role":"kv_both"' in ktc
    if name == "vllm-cpu-pd.yaml":
        cores = {cfg.sections()[r].env["VLLM_CPU_OMP_THREADS_BIND"] for r in (Role.PREFILL, Role.DECODE)}
        assert cores == {"0", "1"}  # one core each, not both on core 0
