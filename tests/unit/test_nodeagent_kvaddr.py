"""Where an endpoint's engine publishes KV events and where its node agent listens (nodeagent.kvaddr)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.config import EngineSection
from core.events import EndpointSpec
from nodeagent.errors import StartupError
from nodeagent.kvaddr import kv_addrs


def section(kv: Any) -> EngineSection:
    return EngineSection.model_validate({"engine_type": "builtin", "engine_config": {"kv_events_config": kv}})


def ep(i: int = 0, ip: str = "10.0.0.5") -> EndpointSpec:
    return EndpointSpec(id=i, ip=ip, business_port=9000 + i, mgmt_port=9000 + i, dp_rank=i)


CASES = [
    (
        "no endpoint: ipc sockets in the run dir, one pair per endpoint",
        {"enable_kv_cache_events": True},
        1,
        "ipc:///run/kv-n1-1.pub",
        "ipc:///run/kv-n1-1.replay",
        "ipc:///run/kv-n1-1.pub",
    ),
    (
        "tcp: offset by DP rank as vLLM does, '*' listened to on the endpoint's IP",
        {"enable_kv_cache_events": True, "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"},
        2,
        "tcp://10.0.0.5:5559",
        "tcp://10.0.0.5:5560",
        "tcp://*:5559",
    ),
    (
        "JSON text as on a vLLM command line, no replay socket",
        '{"enable_kv_cache_events": true, "endpoint": "tcp://*:6000"}',
        0,
        "tcp://10.0.0.5:6000",
        None,
        "tcp://*:6000",
    ),
]


@pytest.mark.parametrize(("what", "kv", "i", "sub", "replay", "engine_pub"), CASES, ids=[c[0] for c in CASES])
def test_addresses(what: str, kv: Any, i: int, sub: str, replay: str | None, engine_pub: str) -> None:
    a = kv_addrs(section(kv), Path("/run"), "n1", ep(i))
    assert a is not None
    assert (a.sub, a.replay, a.config["endpoint"]) == (sub, replay, engine_pub)
    assert a.config["publisher"] == "zmq" and a.config["enable_kv_cache_events"] in (True, "true")


@pytest.mark.parametrize("kv", [None, {}, {"enable_kv_cache_events": False}])
def test_off_unless_enabled(kv: Any) -> None:
    assert kv_addrs(section(kv), Path("/run"), "n1", ep()) is None


def test_a_deep_run_dir_gets_short_socket_paths() -> None:
    a = kv_addrs(section({"enable_kv_cache_events": True}), Path("/x" * 60), "n1", ep())
    assert a is not None and len(a.sub) < 110 and a.sub.endswith(".pub")


def test_bad_json_is_a_startup_error() -> None:
    with pytest.raises(StartupError):
        kv_addrs(section("{not json"), Path("/run"), "n1", ep())
