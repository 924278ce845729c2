"""Seed rules as table tests: fault codes, health defaults, fault-reporter switch, suicide,
snapshot path and namespace, SGLang union mode, MC_USE_IPV6, refresh label."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from coordinator.refresh import RefreshError, validate_refresh
from core import faultcodes
from core.config import EngineSection, HealthCheckConfig, SnapshotConfig
from core.events import (
    EndpointLoad,
    EndpointSpec,
    EndpointStatus,
    EventBase,
    FaultCleared,
    FaultLevel,
    FaultReported,
    HeartbeatData,
    Role,
    StartCommandData,
)
from nodeagent.backends import backend_for
from nodeagent.backends.launch import LaunchContext
from nodeagent.backends.mooncake_env import ipv6_env
from nodeagent.metrics import AgentMetrics
from nodeagent.snapshot import Snapshot, with_namespace
from nodeagent.suicide import AbnormalStreak, SuicideWatch
from tests.unit.coord_events import seed_instance

# --------------------------------------------------------------------------- fault codes


@pytest.mark.parametrize(
    ("code", "handling", "level"),
    [
        ("NODE_REBOOT", None, FaultLevel.L6),
        ("0x0000001", None, FaultLevel.L6),  # the seed's numeric node-watch code
        ("1", None, FaultLevel.L6),
        ("CardUnhealthy", None, FaultLevel.L6),
        ("cardunhealthy", None, FaultLevel.L6),
        ("CardNetworkUnhealthy", None, FaultLevel.L6),
        ("CardUnhealthy", "RestartNPU", FaultLevel.L5),
        ("CardNetworkUnhealthy", "NotHandleFault", FaultLevel.L1),
        ("CardUnhealthy", "FreeRestartNPU", FaultLevel.L4),
        ("engine_unhealthy", None, FaultLevel.L3),
        ("engine_dead", None, FaultLevel.L5),
        ("NODE_SUICIDE", None, FaultLevel.L5),
        ("StartRetriesExhausted", None, FaultLevel.L5),
    ],
)
def test_fault_code_table_gives_the_level(code: str, handling: str | None, level: FaultLevel) -> None:
    assert faultcodes.level_for(code, handling) == level


def test_fault_code_table_names_numeric_codes_and_refuses_unknown_ones() -> None:
    assert faultcodes.canonical("0x0000001") == "NODE_REBOOT"
    assert faultcodes.canonical("MyVendorCode") == "MyVendorCode"
    with pytest.raises(faultcodes.UnknownFaultCode, match="NODE_REBOOT"):
        faultcodes.level_for("MyVendorCode")
    with pytest.raises(faultcodes.UnknownFaultCode, match="SeparateNPU"):
        faultcodes.level_for("CardUnhealthy", "Reboot")


# --------------------------------------------------------------------------- health, fault reporter


def test_health_check_defaults_are_the_seeds() -> None:
    cfg = HealthCheckConfig()
    assert (cfg.timeout, cfg.retry_attempts, cfg.startup_timeout) == (5.0, 3, 1800.0)


@pytest.mark.parametrize(
    ("section", "on"),
    [
        ({}, False),
        ({"engine_config": {"enable_fault_tolerance": True}}, True),
        ({"engine_config": {"enable-fault-tolerance": "true"}}, True),
        ({"engine_config": {"enable_fault_tolerance": False}}, False),
        ({"engine_config": {"enable_fault_tolerance": True}, "fault_tolerance": {"enabled": False}}, False),
        ({"fault_tolerance": {"enabled": True}}, True),
    ],
)
def test_fault_reporter_is_on_when_the_engine_enables_fault_tolerance(
    section: dict[str, Any], on: bool
) -> None:
    sec = EngineSection.model_validate(section)
    assert sec.fault_reporter_on() is on
    assert (sec.fault_tolerance.poll_interval, sec.fault_tolerance.poll_timeout) == (5.0, 5.0)


# --------------------------------------------------------------------------- suicide


def test_abnormal_streak_fires_once_at_the_threshold_and_resets_on_a_normal_beat() -> None:
    s = AbnormalStreak(3)
    assert [s.observe(a) for a in (True, True, False, True, True, True, True)] == [
        False, False, False, False, False, True, False,
    ]  # fmt: skip


def _beat(*statuses: EndpointStatus, instance: int = 4) -> HeartbeatData:
    eps = tuple(EndpointLoad(id=i, status=st) for i, st in enumerate(statuses))
    return HeartbeatData(node_id="n1", instance_id=instance, endpoints=eps)


def test_node_declares_itself_failed_after_n_abnormal_beats_then_clears_when_stopped() -> None:
    posted: list[EventBase] = []
    seq = [10]
    watch = SuicideWatch("n1", 3, posted.append, AgentMetrics("n1"), lambda: seq[0])
    A, R = EndpointStatus.ABNORMAL, EndpointStatus.READY
    for st in (A, A, R, A, A):
        watch.on_beat(_beat(st, R))
    assert posted == []
    seq[0] = 11  # a new start command resets the count (seed: endpoints updated)
    watch.on_beat(_beat(A, R))
    watch.on_beat(_beat(A, R))
    assert posted == []
    watch.on_beat(_beat(A, R))
    assert len(posted) == 1 and isinstance(posted[0], FaultReported)
    d = posted[0].data
    assert (d.code, d.level, d.instance_id, d.node_id) == ("NODE_SUICIDE", FaultLevel.L5, 4, "n1")
    watch.on_beat(_beat(A, R))  # still running: declared once, nothing more
    assert len(posted) == 1
    watch.on_beat(_beat())  # the controller stopped the engines
    assert isinstance(posted[1], FaultCleared) and posted[1].data.fault_id == d.fault_id


# --------------------------------------------------------------------------- snapshot


def test_snapshot_metadata_defaults_to_the_seed_path_and_metadata_dir_still_works() -> None:
    assert SnapshotConfig().metadata_file() == "/snapshot/snapshot_metadata.json"
    assert SnapshotConfig(metadata_path="/x/m.json").metadata_file() == "/x/m.json"
    assert SnapshotConfig(metadata_dir="/d").metadata_file() == "/d/snapshot_metadata.json"


def test_snapshot_writes_namespace_and_a_restored_node_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "meta" / "snap.json"
    cfg = SnapshotConfig(enabled=True, metadata_path=str(path), namespace="team-a")
    snap = Snapshot(cfg, "10.0.0.1", lambda phase, meta: None, lambda: True)
    cmd = StartCommandData(
        command_id="c",
        instance_id=1,
        job_name="job",
        role=Role.UNION,
        master_dp_ip="10.0.0.1",
        node_id="n1",
        engine_type="vllm",
        model="m",
        endpoints=(),
    )
    snap.prepare(cmd)
    meta = orjson.loads(path.read_bytes())
    assert meta["namespace"] == "team-a" and meta["job_name"] == "job"
    (path.parent / "checkpoint").write_text("")
    moved = Snapshot(cfg, "10.0.0.9", lambda phase, meta: None, lambda: True)  # restored elsewhere
    assert moved.restored_namespace() == "team-a" and moved.restored_job() == "job"


@pytest.mark.parametrize(
    ("url", "out"),
    [
        ("nats://nats.old.svc.cluster.local:4222", "nats://nats.team-a.svc.cluster.local:4222"),
        ("tls://u:p@nats.old.svc:4222", "tls://u:p@nats.team-a.svc:4222"),
        ("nats://10.0.0.3:4222", "nats://10.0.0.3:4222"),
        ("nats://nats.example.com:4222", "nats://nats.example.com:4222"),
    ],
)
def test_restored_node_moves_cluster_dns_to_its_namespace(url: str, out: str) -> None:
    assert with_namespace([url], "team-a") == [out]


# --------------------------------------------------------------------------- launch


def _ctx(section: dict[str, Any], role: Role, ip: str, environ: dict[str, str]) -> LaunchContext:
    ep = EndpointSpec(id=0, ip=ip, business_port=9000, mgmt_port=9000)
    return LaunchContext(
        section=EngineSection.model_validate(section),
        role=role,
        instance_id=1,
        endpoint=ep,
        master_dp_ip=ip,
        environ=environ,
    )


MOONCAKE = {
    "engine_type": "vllm",
    "engine_config": {"kv_transfer_config": {"kv_connector": "MooncakeConnectorV1"}},
}
NIXL = {"engine_type": "vllm", "engine_config": {"kv_transfer_config": {"kv_connector": "NixlConnector"}}}
SGLANG = {"engine_type": "sglang", "model_path": "/m"}


@pytest.mark.parametrize(
    ("section", "role", "ip", "environ", "want"),
    [
        (MOONCAKE, Role.PREFILL, "fd03::1", {}, {"MC_USE_IPV6": "1"}),
        (MOONCAKE, Role.PREFILL, "10.0.0.1", {}, {}),
        (MOONCAKE, Role.PREFILL, "fd03::1", {"MC_USE_IPV6": "0"}, {}),  # the environment wins
        ({**MOONCAKE, "env": {"MC_USE_IPV6": "0"}}, Role.PREFILL, "fd03::1", {}, {}),
        (NIXL, Role.PREFILL, "fd03::1", {}, {}),
        (NIXL, Role.PREFILL, "10.0.0.1", {"MOONCAKE_ASCEND_IPV6_EXPERIMENT": "1"}, {"MC_USE_IPV6": "1"}),
        (SGLANG, Role.DECODE, "fd03::1", {}, {"MC_USE_IPV6": "1"}),  # SGLang's default backend
        (SGLANG, Role.UNION, "fd03::1", {}, {}),
    ],
)
def test_mc_use_ipv6_for_mooncake_over_ipv6(
    section: dict[str, Any], role: Role, ip: str, environ: dict[str, str], want: dict[str, str]
) -> None:
    ctx = _ctx(section, role, ip, environ)
    assert ipv6_env(ctx) == want
    spec = backend_for(ctx.section.engine_type).launch(ctx)
    assert spec.env.get("MC_USE_IPV6") == want.get("MC_USE_IPV6")


def test_sglang_union_gets_disaggregation_mode_null() -> None:
    shared = {**SGLANG, "engine_config": {"disaggregation_mode": "prefill"}}
    argv = backend_for("sglang").launch(_ctx(shared, Role.UNION, "10.0.0.1", {})).argv
    assert argv[argv.index("--disaggregation-mode") + 1] == "null"


# --------------------------------------------------------------------------- refresh


@pytest.mark.parametrize(
    ("label", "ok"), [(2, True), (3, True), (0, False), (1, False), (4, False), (85, False)]
)
def test_refresh_label_must_be_2_or_3(label: int, ok: bool) -> None:
    body = {"ids": [0], "instances": [seed_instance(0, 85, label)]}
    if ok:
        assert validate_refresh(body).instances[0]["static_info"]["label"] == label
    else:
        with pytest.raises(
            RefreshError, match=r"instances\[0\]\.static_info\.label: must be 2 \(prefill\) or 3"
        ):
            validate_refresh(body)
