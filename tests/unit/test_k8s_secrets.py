"""`motor k8s secrets`: NATS users from the manifests, passwords kept, bad input named."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from deploy.cli import main
from deploy.k8s_secrets import (
    CLIENTS_SECRET,
    NODEAGENTS_SECRET,
    SERVER_KEY,
    SERVER_SECRET,
    ManifestError,
    dump,
    kept_passwords,
    load_objects,
    make_secrets,
    plan,
)
from streams.permissions import cluster_users

CONFIG = "nats:\n  urls: [nats://nats:4222]\nunion:\n  instances: 1\n"


def _sts(name: str, replicas: Any = 1, component: str = "nodeagent", ns: str = "motor") -> dict[str, Any]:
    labels = {"app.kubernetes.io/component": component}
    return {
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "template": {"metadata": {"labels": labels}}},
    }


def _cm(text: str = CONFIG, ns: str = "motor") -> dict[str, Any]:
    return {
        "kind": "ConfigMap",
        "metadata": {"name": "motor-config-x", "namespace": ns},
        "data": {"motor.yaml": text},
    }


def _by_name(secrets: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {s["metadata"]["name"]: s["stringData"] for s in secrets}


def test_node_ids_are_the_pod_names_of_node_agent_statefulsets() -> None:
    p = plan([_cm(), _sts("motor-node-union", 2), _sts("motor-node-decode"), _sts("nats", 3, "nats")])
    assert p.node_ids == ("motor-node-union-0", "motor-node-union-1", "motor-node-decode-0")
    assert p.namespace == "motor"
    assert p.config.nats.urls == ["nats://nats:4222"]


def test_every_user_of_the_cluster_gets_a_login_and_the_server_knows_it() -> None:
    p = plan([_cm(), _sts("motor-node-union", 2)])
    secrets = _by_name(make_secrets(p))
    conf = secrets[SERVER_SECRET][SERVER_KEY]
    files = {**secrets[CLIENTS_SECRET], **secrets[NODEAGENTS_SECRET]}
    assert sorted(files) == sorted(f"{u.name}.json" for u in cluster_users(p.node_ids))
    assert set(secrets[NODEAGENTS_SECRET]) == {
        "nodeagent-motor-node-union-0.json",
        "nodeagent-motor-node-union-1.json",
    }
    for key, text in files.items():
        ctx = orjson.loads(text)
        assert f"{ctx['user']}.json" == key
        assert ctx["url"] == "nats://nats:4222" and ctx["inbox_prefix"] == f"_INBOX.{ctx['user']}"
        # The same user and password in the server's authorization block.
        assert re.search(rf'user: "{ctx["user"]}"\n\s+password: "{re.escape(ctx["password"])}"', conf)


def test_an_earlier_output_keeps_its_passwords_and_a_new_node_gets_one() -> None:
    first = make_secrets(plan([_cm(), _sts("motor-node-union", 1)]))
    old = kept_passwords(load_objects(dump(first), "old.yaml"))
    assert set(old) == {u.name for u in cluster_users(["motor-node-union-0"])}
    second = make_secrets(plan([_cm(), _sts("motor-node-union", 2)]), old)
    new = kept_passwords(second)
    assert {u: new[u] for u in old} == old
    assert new["nodeagent-motor-node-union-1"] not in old.values()


def test_a_secret_read_back_from_the_cluster_keeps_its_passwords_too() -> None:
    """`kubectl get secret -o yaml` gives `data` (base64), not `stringData`."""
    import base64

    (_, clients, _) = make_secrets(plan([_cm(), _sts("motor-node-union")]))
    data = {k: base64.b64encode(v.encode()).decode() for k, v in clients["stringData"].items()}
    got = {**clients, "data": data}
    del got["stringData"]
    listed = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [got]})
    assert kept_passwords(load_objects(listed, "kubectl get")) == kept_passwords([clients])
    assert len(kept_passwords([clients])) == 5


@pytest.mark.parametrize(
    ("objects", "message"),
    [
        ([_cm()], "no node agents"),
        ([_cm(), _sts("motor-node-union", -1)], "StatefulSet/motor-node-union: spec.replicas"),
        ([_cm(), _sts("motor-node-union", "2")], "spec.replicas must be a non-negative integer"),
        ([_sts("motor-node-union")], "one ConfigMap with a motor.yaml key, found 0"),
        ([_cm("union: {instances: -1}\n"), _sts("motor-node-union")], "union.instances"),
        (
            [_cm(), _sts("motor-node-union", ns="a"), _sts("motor-node-decode", ns="b")],
            "more than one namespace",
        ),
    ],
)
def test_manifests_that_cannot_be_used_are_named(objects: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ManifestError, match=re.escape(message)):
        plan(objects)


def test_the_command_prints_secrets_or_one_line_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "rendered.yaml"
    good.write_text(dump([_cm(), _sts("motor-node-union", 1)]))
    assert main(["k8s", "secrets", "-f", str(good)]) == 0
    out, err = capsys.readouterr()
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(out)] == [
        SERVER_SECRET,
        CLIENTS_SECRET,
        NODEAGENTS_SECRET,
    ]
    assert "1 node agents (motor-node-union-0), 0 passwords kept" in err
    kept = tmp_path / "old.yaml"
    kept.write_text(out)
    assert main(["k8s", "secrets", "-f", str(good), "--keep", str(kept), "--namespace", "other"]) == 0
    out2, err = capsys.readouterr()
    assert "6 passwords kept" in err
    assert {d["metadata"]["namespace"] for d in yaml.safe_load_all(out2)} == {"other"}

    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: [unclosed\n")
    assert main(["k8s", "secrets", "-f", str(bad)]) == 2
    _, err = capsys.readouterr()
    assert err.startswith(f"motor k8s secrets: {bad}: not valid YAML") and "Traceback" not in err
    assert main(["k8s", "secrets", "-f", str(tmp_path / "missing.yaml")]) == 2
    assert "No such file" in capsys.readouterr().err
