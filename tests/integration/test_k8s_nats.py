"""Our values for the official NATS chart, and the server config they make, run by a real nats-server.

The chart itself is not in this repository (its templates are the NATS project's code, not
ours) and no package we install ships it, so it is not rendered here. What is ours is tested:

- the values (deploy/k8s/nats/values.yaml) say what Motor needs: three servers in one
  cluster, JetStream on a file store with `sync_interval: always`, and the Secret that
  `motor k8s secrets` makes mounted into the server and included into its config;
- the nats-server configuration those values merge in (`config.jetstream.merge`,
  `config.merge` with its `$include`), assembled here into a `nats.conf` as the chart's
  documentation says it merges them, with the generated `auth.conf` at the path the include
  names: `nats-server -t` checks it, then a real nats-server runs it (one server instead of a
  cluster, on free local ports, its store in a temp dir), and the generated logins are used
  as the pods use them: `motor events ensure` as admin creates the streams the controller's
  config asks for, and the controller's own user then finds nothing to change.

Not checked offline: what the chart makes of the values (its StatefulSet, Services, routes,
config reloader, and that our JSON patches apply to its pod template).
"""

from __future__ import annotations

import asyncio
import os
import posixpath
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import pytest_asyncio
import yaml

from core.config import ClusterConfig
from core.configfile import parse_config
from deploy.k8s_secrets import CLIENTS_SECRET, NODEAGENTS_SECRET, SERVER_KEY, SERVER_SECRET
from streams.connection import NatsOptions, connect
from streams.credentials import CONTEXT_ENV, load_context
from streams.definitions import ensure_streams
from streams.errors import NatsUnavailable, StreamsError
from streams.server import find_nats_server
from tests.integration.k8s_render import (
    K8S_VERSIONS,
    ROOT,
    by_kind,
    docs,
    kustomize_text,
    nats_values,
    validate,
)

# Where the chart mounts its config map (nats.conf): the directory the include is relative to.
# The chart's documented layout, not rendered here.
CHART_CONF_DIR = "/etc/nats-config"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _secrets() -> dict[str, dict[str, str]]:
    """`kubectl kustomize overlays/smoke | motor k8s secrets`, the real command."""
    proc = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "k8s", "secrets"],
        input=kustomize_text("smoke"),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return {s["metadata"]["name"]: s["stringData"] for s in docs(proc.stdout)}


# --------------------------------------------------------------------------- the values


def test_the_values_ask_for_three_durable_jetstream_servers() -> None:
    values = nats_values()
    cfg = values["config"]
    assert values["fullnameOverride"] == "nats"  # Motor's config names nats://nats:4222
    assert cfg["cluster"] == {"enabled": True, "replicas": 3}
    js = cfg["jetstream"]
    assert js["enabled"] is True
    assert js["fileStore"]["enabled"] is True and js["fileStore"]["pvc"]["enabled"] is True
    assert js["fileStore"]["dir"].startswith("/")
    assert js["merge"] == {"sync_interval": "always"}, "every write synced to disk"
    assert cfg["monitor"]["enabled"] is True
    assert values["podDisruptionBudget"]["enabled"] is True
    assert values["natsBox"]["enabled"] is False, "nats-box logs in anonymously, which the server refuses"
    # The server's resources, as a container of a valid pod: requests, a memory limit, no CPU limit.
    resources = values["container"]["merge"]["resources"]
    assert set(resources["limits"]) == {"memory"} and {"cpu", "memory"} <= set(resources["requests"])
    _validate_pod(containers=[{"name": "nats", "image": "nats", "resources": resources}])


def _validate_pod(volumes: list[Any] | None = None, containers: list[Any] | None = None) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "nats-0"},
        "spec": {"volumes": volumes or [], "containers": containers or []},
    }
    for version in K8S_VERSIONS:
        validate(pod, version)


def _include(values: dict[str, Any]) -> str:
    include = values["config"]["merge"]["$include"]
    assert isinstance(include, str) and not include.startswith("/")
    return include


def test_the_server_includes_the_users_of_the_secret_motor_k8s_secrets_makes() -> None:
    values = nats_values()
    path = posixpath.normpath(posixpath.join(CHART_CONF_DIR, _include(values)))
    container, pod = values["container"]["patch"], values["podTemplate"]["patch"]
    for patch in (*container, *pod):  # appended: the chart's own mounts and volumes stay
        assert patch["op"] == "add" and patch["path"] in ("/volumeMounts/-", "/spec/volumes/-"), patch
    mounts = [p["value"] for p in container if p["path"] == "/volumeMounts/-"]
    (mount,) = [m for m in mounts if m["mountPath"] == posixpath.dirname(path)]
    assert mount.get("readOnly") is True
    (volume,) = [
        p["value"] for p in pod if p["path"] == "/spec/volumes/-" and p["value"]["name"] == mount["name"]
    ]
    secret = volume["secret"]
    assert secret["secretName"] == SERVER_SECRET
    items = {i["path"]: i["key"] for i in secret.get("items", [])}
    assert items.get(posixpath.basename(path), posixpath.basename(path)) == SERVER_KEY
    assert SERVER_KEY in _secrets()[SERVER_SECRET], "motor k8s secrets makes no such key"
    # The volume and the mount as the chart's pod would carry them are valid Kubernetes objects.
    _validate_pod(volumes=[volume], containers=[{"name": "nats", "image": "nats", "volumeMounts": [mount]}])


# --------------------------------------------------------------------------- the server config


def server_conf(values: dict[str, Any], **over: Any) -> dict[str, Any]:
    """The nats.conf settings our values make, as the chart merges them: JetStream on the file
    store with `config.jetstream.merge` in its block, the monitor port, `config.merge` at the
    top level (its `$include` apart, see `render`); `over` laid over the top level."""
    cfg = values["config"]
    top: dict[str, Any] = {"port": cfg.get("nats", {}).get("port", 4222)}
    if cfg.get("monitor", {}).get("enabled"):
        top["http_port"] = cfg["monitor"].get("port", 8222)
    js = cfg["jetstream"]
    if js.get("enabled"):
        store = js["fileStore"]
        top["jetstream"] = {
            **({"store_dir": store["dir"]} if store.get("enabled") else {}),
            **js.get("merge", {}),
        }
    top.update({k: v for k, v in cfg.get("merge", {}).items() if k != "$include"})
    top.update(over)
    return top


def render(top: dict[str, Any], include: str) -> str:
    """The settings as a nats.conf (JSON values are valid NATS config), then the include."""
    lines = [f"{key}: {orjson.dumps(value).decode()}" for key, value in top.items()]
    return "\n".join([*lines, f"include {include}", ""])


def _lay_out(root: Path, conf: str, include: str, auth: str) -> Path:
    """The server's files where the pod has them, under `root` instead of `/`."""
    conf_path = root / CHART_CONF_DIR.lstrip("/") / "nats.conf"
    auth_path = root / posixpath.normpath(posixpath.join(CHART_CONF_DIR, include)).lstrip("/")
    for path, text in ((conf_path, conf), (auth_path, auth)):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return conf_path


def _check(conf_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [find_nats_server(), "-t", "-c", str(conf_path)], capture_output=True, text=True, timeout=30
    )


def test_the_server_config_with_the_generated_users_is_valid(tmp_path: Path) -> None:
    values = nats_values()
    include = _include(values)
    auth = _secrets()[SERVER_SECRET][SERVER_KEY]
    path = _lay_out(tmp_path, render(server_conf(values), include), include, auth)
    proc = _check(path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # The check reads the included users: a broken block fails it.
    auth_path = tmp_path / posixpath.normpath(posixpath.join(CHART_CONF_DIR, include)).lstrip("/")
    auth_path.write_text(auth.replace("password:", "pasword:", 1))
    proc = _check(path)
    assert proc.returncode != 0 and "pasword" in proc.stdout + proc.stderr


@dataclass
class Server:
    url: str
    monitor: str
    root: Path
    secrets: dict[str, dict[str, str]]
    contexts: Path

    def context(self, user: str) -> Path:
        return self.contexts / f"{user}.json"


def _wait_port(port: int, proc: subprocess.Popen[bytes], within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"nats-server exited with {proc.returncode}"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nats-server did not listen on {port} within {within}s")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A nats-server running our values' config with the generated users (one server, local ports)."""
    root = tmp_path_factory.mktemp("nats-k8s")
    port, monitor = _free_port(), _free_port()
    values = nats_values()
    include = _include(values)
    top = server_conf(values, port=port, http_port=monitor, host="127.0.0.1", pid_file=str(root / "nats.pid"))
    top["jetstream"]["store_dir"] = str(root / "data")
    secrets = _secrets()
    conf = _lay_out(root, render(top, include), include, secrets[SERVER_SECRET][SERVER_KEY])
    contexts = root / "contexts"
    contexts.mkdir()
    for name in (CLIENTS_SECRET, NODEAGENTS_SECRET):
        for key, text in secrets[name].items():
            (contexts / key).write_text(text)
    log = (root / "nats.log").open("wb")
    proc = subprocess.Popen([find_nats_server(), "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_port(port, proc)
        yield Server(f"nats://127.0.0.1:{port}", f"http://127.0.0.1:{monitor}", root, secrets, contexts)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_the_running_server_syncs_every_write_to_its_file_store(server: Server) -> None:
    with urllib.request.urlopen(f"{server.monitor}/varz", timeout=10) as resp:
        varz = orjson.loads(resp.read())
    js = varz["jetstream"]["config"]
    assert js["sync_always"] is True, "sync_interval: always did not reach the server"
    assert js["store_dir"].startswith(str(server.root / "data"))


def _config(tmp: Path, **nats: Any) -> tuple[ClusterConfig, Path]:
    """The smoke overlay's config map, with this test's NATS settings laid over (one server: replicas 1)."""
    (cm,) = [
        o for o in by_kind(docs(kustomize_text("smoke")), "ConfigMap") if "motor.yaml" in o.get("data", {})
    ]
    raw = yaml.safe_load(cm["data"]["motor.yaml"])
    raw["nats"].update(nats)
    path = tmp / "motor.yaml"
    path.write_text(yaml.safe_dump(raw))
    return parse_config(path.read_text(), str(path)), path


async def _motor(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deploy.cli", *args, cwd=ROOT, env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest_asyncio.fixture(loop_scope="session")
async def streams_made(server: Server, tmp_path: Path) -> AsyncIterator[ClusterConfig]:
    """The streams as the controller's init container makes them: `motor events ensure` as admin."""
    cfg, path = _config(tmp_path, replicas=1, max_age_days=7)
    env = {CONTEXT_ENV: str(server.context("admin")), "MOTOR_NATS_URL": server.url}
    rc, out, err = await _motor("events", "ensure", "--config", str(path), env=env)
    assert rc == 0, err
    assert "MOTOR" in out and "MOTOR_HB" in out
    yield cfg


def _as(server: Server, user: str, cfg: ClusterConfig) -> NatsOptions:
    """What a pod's process connects with: its context file (MOTOR_NATS_CONTEXT), the config's URLs."""
    opts = NatsOptions.from_config(cfg.nats, [server.url], env={CONTEXT_ENV: str(server.context(user))})
    assert opts.user == user and opts.inbox_prefix == f"_INBOX.{user}"
    return opts


async def test_the_controller_finds_the_streams_it_would_make(
    server: Server, streams_made: ClusterConfig
) -> None:
    cfg = streams_made
    nc = await connect(_as(server, "controller", cfg), name="controller-test")
    try:
        # What ControllerService.run does first; its user may not create or change streams.
        await asyncio.wait_for(
            ensure_streams(nc.jetstream(), cfg.nats, lease_ttl=cfg.controller.lease_ttl), 30
        )
        # Settings other than the config's would need a change the controller may not make.
        other = cfg.nats.model_copy(update={"max_age_days": 30})
        with pytest.raises(StreamsError, match="cannot update stream MOTOR"):
            await asyncio.wait_for(
                ensure_streams(nc.jetstream(), other, lease_ttl=cfg.controller.lease_ttl), 30
            )
    finally:
        await nc.close()


async def test_a_node_agent_logs_in_as_itself_and_nobody_anonymously(
    server: Server, streams_made: ClusterConfig
) -> None:
    cfg = streams_made
    nc = await connect(_as(server, "nodeagent-motor-node-union-0", cfg), name="agent-test")
    try:
        ack = await nc.jetstream().publish("motor.hb.motor-node-union-0", orjson.dumps({"probe": 1}))
        assert ack.seq >= 1
    finally:
        await nc.close()
    with pytest.raises(NatsUnavailable, match="uthoriz"):
        await connect(server.url, name="anonymous")
    wrong = load_context(server.context("coordinator"))
    with pytest.raises(NatsUnavailable, match="uthoriz"):
        await connect(NatsOptions(urls=[server.url], user=wrong.user, password="not-it"), name="wrong")


async def test_ensure_names_a_bad_config_and_an_unreachable_server(server: Server, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("nats: {replicas: 9}\nunion: {instances: 1}\n")
    env = {CONTEXT_ENV: str(server.context("admin")), "MOTOR_NATS_URL": server.url}
    rc, _, err = await _motor("events", "ensure", "--config", str(bad), env=env)
    assert rc == 2 and "nats.replicas" in err and "Traceback" not in err
    env["MOTOR_NATS_URL"] = f"nats://127.0.0.1:{_free_port()}"
    rc, _, err = await _motor("events", "ensure", env=env)
    assert rc == 1 and "cannot reach NATS" in err and "Traceback" not in err
