from typing import Any

import pytest

from core.config import config_from_dict
from core.events import Role
from nodeagent.errors import StartupError
from nodeagent.registration import build_registration
from nodeagent.settings import AgentSettings, device_env, parse_devices, split_devices


def settings(role: Role, sections: dict[str, Any], **kw: Any) -> AgentSettings:
    cfg = config_from_dict(sections)
    return AgentSettings(config=cfg, node_id="n1", role=role, ip="10.0.0.5", engine_port_base=9000, **kw)


def test_registration_carries_every_field() -> None:
    s = settings(
        Role.PREFILL,
        {
            "prefill": {
                "engine_type": "sglang",
                "model": "qwen3",
                "engine_config": {
                    "tp_size": 2,
                    "disaggregation-bootstrap-port": 8998,
                    "context_length": 32768,
                },
            },
            "decode": {"engine_type": "sglang"},
        },
        devices=("0", "1"),
        job_name="job-a",
    )
    reg = build_registration(s, agent_url="http://10.0.0.5:8200", instance_id=4, running_endpoints=(0,))
    assert reg.node_id == "n1" and reg.job_name == "job-a" and reg.pod_ip == "10.0.0.5"
    assert reg.role == Role.PREFILL and reg.engine_type == "sglang" and reg.model == "qwen3"
    assert reg.devices == ("0", "1")
    assert len(reg.endpoints) == 1
    ep = reg.endpoints[0]
    assert (ep.id, ep.ip, ep.business_port, ep.bootstrap_port) == (0, "10.0.0.5", 9000, 8998)
    assert reg.parallel.tp == 2
    assert reg.capacity.max_seq_len == 32768
    assert reg.capabilities == ("bootstrap",)
    assert reg.agent_url == "http://10.0.0.5:8200"
    assert reg.instance_id == 4 and reg.running_endpoints == (0,)


def test_one_endpoint_per_local_dp_rank() -> None:
    s = settings(
        Role.UNION,
        {
            "union": {
                "engine_type": "vllm",
                "engine_config": {
                    "nnodes": 2,
                    "data_parallel_size": 4,
                    "data_parallel_size_local": 2,
                    "tensor_parallel_size": 8,
                },
            }
        },
        devices=tuple(str(i) for i in range(16)),
    )
    reg = build_registration(s)
    assert [(e.id, e.business_port, e.bootstrap_port) for e in reg.endpoints] == [
        (0, 9000, None),
        (1, 9001, None),
    ]
    assert (reg.parallel.tp, reg.parallel.dp, reg.parallel.dp_local, reg.parallel.nnodes) == (8, 4, 2, 2)
    assert reg.capabilities == ()


def test_builtin_prefill_gets_a_bootstrap_port_after_its_business_ports() -> None:
    s = settings(Role.PREFILL, {"prefill": {}, "decode": {}})
    reg = build_registration(s)
    assert reg.endpoints[0].bootstrap_port == 9001
    assert reg.capabilities == ("handoff", "bootstrap")
    d = build_registration(settings(Role.DECODE, {"prefill": {}, "decode": {}}))
    assert d.endpoints[0].bootstrap_port is None


def test_builtin_handoff_only_has_no_bootstrap_port() -> None:
    s = settings(
        Role.PREFILL, {"prefill": {"dispatch_profile": "handoff"}, "decode": {"dispatch_profile": "handoff"}}
    )
    assert build_registration(s).endpoints[0].bootstrap_port is None


@pytest.mark.parametrize(
    ("role", "sections", "needle"),
    [
        (Role.DECODE, {"union": {}}, "no 'decode' engine section"),
        (
            Role.PREFILL,
            {
                "prefill": {
                    "engine_type": "vllm",
                    "engine_config": {"kv_transfer_config": {"kv_connector": "FancyConnector"}},
                },
                "decode": {},
            },
            "FancyConnector",
        ),
    ],
)
def test_startup_errors(role: Role, sections: dict[str, Any], needle: str) -> None:
    with pytest.raises(StartupError, match=needle):
        build_registration(settings(role, sections))


@pytest.mark.parametrize(
    ("engine_config", "needle"),
    [
        ({"max_model_len": -1}, "max_seq_len"),
        ({"max_num_seqs": 2**40}, "total_slots"),
        ({"tensor_parallel_size": 0}, "tp"),
    ],
)
def test_an_engine_option_no_registration_may_carry_is_a_startup_error_naming_it(
    engine_config: dict[str, Any], needle: str
) -> None:
    """Issue 24: the registration's bounds refused it with a pydantic traceback."""
    s = settings(Role.UNION, {"union": {"engine_config": engine_config}})
    with pytest.raises(StartupError, match=needle):
        build_registration(s)


def test_uneven_devices_fail_at_startup() -> None:
    s = settings(Role.UNION, {"union": {"engine_config": {"data_parallel_size": 2}}}, devices=("0", "1", "2"))
    with pytest.raises(StartupError, match="not divisible by the 2 endpoints"):
        build_registration(s)


def test_device_helpers() -> None:
    devs = parse_devices(" 0,1, 2,3 ")
    assert devs == ("0", "1", "2", "3")
    assert split_devices(devs, 2, 1) == ("2", "3")
    assert split_devices((), 2, 1) == ()
    assert device_env("ASCEND_RT_VISIBLE_DEVICES", ("2", "3")) == {"ASCEND_RT_VISIBLE_DEVICES": "2,3"}
    assert device_env("CUDA_VISIBLE_DEVICES", ()) == {}
