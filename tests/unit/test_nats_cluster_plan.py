"""Pure parts of the NATS cluster `motor up --nats-cluster N` runs: members, the cluster block,
replicas fit for the cluster, the placement line, and the ack audit."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.config import config_from_dict
from deploy.cluster import LocalCluster
from deploy.clusterplan import Ports
from deploy.hosts import LOCAL, Host
from deploy.natscluster import NatsCluster, plan_members
from streams.ackjournal import Acked, AckJournal, audit, event_id, read_journal
from streams.placement import Replica, StreamPlacement
from streams.server import cluster_conf, route_url


def test_members_take_the_base_ports_plus_their_index_round_robin_over_hosts() -> None:
    hosts = [Host("h1", "198.18.0.11", "h1"), Host("h2", "198.18.0.12", "h2")]
    ms = plan_members(3, hosts, port=4222, monitor_port=8222, route_port=6222)
    assert [(m.name, m.host.name, m.port, m.monitor_port, m.route_port) for m in ms] == [
        ("n1", "h1", 4222, 8222, 6222),
        ("n2", "h2", 4223, 8223, 6223),
        ("n3", "h1", 4224, 8224, 6224),
    ]
    assert ms[1].url == "nats://198.18.0.12:4223"
    with pytest.raises(ValueError, match="at least 1"):
        plan_members(0, hosts, port=1, monitor_port=2, route_port=3)


def test_the_cluster_block_names_every_route_with_its_login() -> None:
    url = route_url("127.0.0.1", 6222, "route", "p@ss/word")
    assert url == "nats-route://route:p%40ss%2Fword@127.0.0.1:6222"
    block = cluster_conf("motor", "127.0.0.1:6222", [url], user="route", password="p@ss/word")
    assert 'name: "motor"' in block and 'listen: "127.0.0.1:6222"' in block
    assert 'user: "route"' in block and 'password: "p@ss/word"' in block
    assert f'routes: ["{url}"]' in block
    assert "authorization" not in cluster_conf("motor", "h:1", ["nats-route://h:1"])


def test_each_member_gets_its_own_store_name_and_log_and_runs_on_its_host(tmp_path: Path) -> None:
    h = Host("h2", "198.18.0.12", "motor-h2")
    ms = plan_members(3, [LOCAL, h], port=4222, monitor_port=8222, route_port=6222)
    c = NatsCluster(tmp_path, ms, tmp_path / "logs", route_password="pw")
    n2 = c.server("nats-n2")
    assert n2.store_dir == tmp_path / "nats" / "n2" and n2.server_name == "n2"
    assert n2.argv_prefix == ("ip", "netns", "exec", "motor-h2") and n2.host == "198.18.0.12"
    assert n2.log_file == tmp_path / "logs" / "nats-n2.log"
    assert "routes" in n2.extra_conf and c.url.count("nats://") == 3
    single = NatsCluster(tmp_path, ms[:1], tmp_path / "logs")
    one = single.server("nats-server")
    assert one.store_dir == tmp_path / "nats" and one.server_name is None and "cluster" not in one.extra_conf


def _cfg(nats: dict[str, object] | None = None) -> object:
    raw: dict[str, object] = {"union": {"instances": 1, "engine_type": "builtin"}}
    if nats is not None:
        raw["nats"] = nats
    return config_from_dict(raw, "<t>")


@pytest.mark.parametrize(
    ("servers", "nats", "want"),
    [
        (1, None, 1),
        (3, None, 3),
        (7, None, 5),  # JetStream's limit
        (3, {"replicas": 1}, 1),  # the operator's choice stands
        (3, {"replicas": 3}, 3),
    ],
)
def test_replicas_follow_the_cluster_unless_the_config_sets_them(
    servers: int, nats: dict[str, object] | None, want: int
) -> None:
    lc = LocalCluster(_cfg(nats), nats_cluster=servers, ports=Ports())  # type: ignore[arg-type]
    assert lc.cfg.nats.replicas == want


def test_more_replicas_than_servers_is_refused_naming_both() -> None:
    with pytest.raises(
        ValueError, match=r"nats.replicas is 3 but only 1 nats-server runs: use --nats-cluster 3"
    ):
        LocalCluster(_cfg({"replicas": 3}))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="external NATS"):
        LocalCluster(_cfg(), nats_cluster=3, nats_url="nats://x:4222")  # type: ignore[arg-type]


def test_processes_run_on_their_placed_host_and_bind_its_address() -> None:
    hosts = [Host("h1", "198.18.0.11", "h1"), Host("h2", "198.18.0.12", "h2")]
    lc = LocalCluster(
        _cfg(),  # type: ignore[arg-type]
        hosts=hosts,
        nats_cluster=1,
        placement={"coordinator": "h2", "nats-n1": "h2"},
    )
    assert lc.host_of("coordinator").name == "h2" and lc.host_of("controller-c1").name == "h1"
    assert lc.coordinator_url.startswith("http://198.18.0.12:")
    assert lc.url == "nats://198.18.0.12:4222"
    assert LOCAL.bind("0.0.0.0") == "0.0.0.0" and hosts[0].bind("0.0.0.0") == "198.18.0.11"


def test_the_placement_line_says_who_leads_and_how_each_replica_fares() -> None:
    p = StreamPlacement("MOTOR", 3, "n2", (Replica("n1", True), Replica("n3", False, lag=12)))
    assert p.describe() == "MOTOR leader n2 · n1 current, n3 lag 12 (R3)"
    assert (
        StreamPlacement("MOTOR", 3, "n1", (Replica("n3", False, True),))
        .describe()
        .endswith("n3 offline (R3)")
    )
    assert StreamPlacement("MOTOR", 1, None).describe() == "MOTOR on one server (R1)"
    assert StreamPlacement("MOTOR", 3, None).describe() == "MOTOR: no leader (R3)"
    assert "no answer" in StreamPlacement("MOTOR", 0, None, error="no answer").describe()


def test_the_ack_audit_names_what_was_acknowledged_and_is_gone(tmp_path: Path) -> None:
    j = AckJournal(tmp_path / "acks" / "1.jsonl")
    j.record("a", "node.heartbeat", "MOTOR_HB", 1, False)
    j.record("b", "fault.cleared", "MOTOR", 5, False)
    j.record("b", "fault.cleared", "MOTOR", 5, True)  # a retried publish: one event
    j.record("c", "fault.cleared", "MOTOR", 6, False)
    with (tmp_path / "acks" / "1.jsonl").open("ab") as fh:
        fh.write(b'{"id": "torn')  # killed mid-line
    acks = list(read_journal(tmp_path / "acks"))
    assert [a.id for a in acks] == ["a", "b", "b", "c"]
    result = audit(acks, "MOTOR", {"b": 5, "c": 9})
    assert (
        result.acked == 2 and result.kept and result.moved == ((Acked("c", "fault.cleared", "MOTOR", 6), 9),)
    )
    lost = audit(acks, "MOTOR", {"b": 5})
    assert not lost.kept and [a.id for a in lost.missing] == ["c"]
    assert event_id(b'{"id": "x", "type": "t"}') == "x" and event_id(b"not json") is None
    assert event_id(b"[1]") is None
    assert AckJournal.from_env({}) is None
    assert AckJournal.from_env({"MOTOR_ACK_JOURNAL": str(tmp_path / "d")}) is not None
