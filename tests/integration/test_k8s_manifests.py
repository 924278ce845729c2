"""deploy/k8s rendered by the real kustomize, every object valid, and wired to the code.

The expectations come from the code, not from copies of it: the routes each process's HTTP
app really has, the flags its parser accepts, the `MOTOR_*` variables the code reads, the
config map parsed by `core.config`, the Secrets `motor k8s secrets` makes for exactly these
manifests, and the metric names the coordinator exports. A renamed route, flag, variable
or metric fails here.

The NATS side (our values for the official chart, the server config they make) is
tests/integration/test_k8s_nats.py.
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

import orjson
import pytest

from core.config import ClusterConfig
from core.configfile import parse_config
from tests.integration.k8s_render import (
    K8S,
    K8S_VERSIONS,
    OVERLAYS,
    ROOT,
    by_kind,
    container_env,
    expand,
    kustomize,
    motor_containers,
    named,
    nats_values,
    pod_names,
    pod_specs,
    validate,
)

CONFIG_KEY = "motor.yaml"
# The NATS user each command logs in as (a node agent: its own, nodeagent-<pod>).
LOGINS = {"controller": "controller", "coordinator": "coordinator", "events": "admin"}


def _config(objects: list[dict[str, Any]]) -> ClusterConfig:
    (cm,) = [o for o in by_kind(objects, "ConfigMap") if CONFIG_KEY in o.get("data", {})]
    return parse_config(cm["data"][CONFIG_KEY], f"ConfigMap {cm['metadata']['name']}")


def _component(workload: dict[str, Any]) -> str:
    return str(workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"])


def test_overlays_are_found() -> None:
    assert {"smoke", "vllm-gpu"} <= set(OVERLAYS)


# --------------------------------------------------------------------------- schemas


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_of_an_overlay_is_valid(overlay: str, version: str) -> None:
    objects = kustomize(overlay)
    assert len(objects) > 10
    for obj in objects:
        validate(obj, version)


def test_a_typo_in_a_manifest_fails_validation() -> None:
    """The validation refuses an unknown field (what a misspelt key becomes)."""
    obj = named(kustomize("smoke"), "Deployment", "motor-controller")
    spec = obj["spec"]["template"]["spec"]
    spec["containers"][0]["livenessProbes"] = spec["containers"][0].pop("livenessProbe")
    with pytest.raises(AssertionError, match="livenessProbes"):
        validate(obj, K8S_VERSIONS[-1])
    # A ServiceMonitor has no schema here: the fields our manifests use are known, others fail.
    (sm, *_) = by_kind(kustomize("vllm-gpu"), "ServiceMonitor")
    sm["spec"]["endpoints"][0]["paht"] = "/metrics"
    with pytest.raises(AssertionError, match="paht"):
        validate(sm, K8S_VERSIONS[-1])
    (sm, *_) = by_kind(kustomize("vllm-gpu"), "ServiceMonitor")
    sm["metadata"]["lables"] = {}
    with pytest.raises(AssertionError, match="lables"):
        validate(sm, K8S_VERSIONS[-1])
    (sm, *_) = by_kind(kustomize("vllm-gpu"), "ServiceMonitor")
    sm["apiVersion"] = "monitoring.coreos.com/v2"
    with pytest.raises(AssertionError, match="no schema"):
        validate(sm, K8S_VERSIONS[-1])


# --------------------------------------------------------------------------- config, args, env


# The NATS chart names its client Service after `fullnameOverride` and serves clients on
# `config.nats.port`, 4222 unless the values say otherwise (the chart's documented defaults;
# the chart itself is not rendered here).
NATS_CLIENT_PORT = 4222


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_config_map_parses_and_names_the_nats_service(overlay: str) -> None:
    cfg = _config(kustomize(overlay))
    values = nats_values()
    port = values["config"].get("nats", {}).get("port", NATS_CLIENT_PORT)
    assert cfg.nats.urls
    for url in cfg.nats.urls:
        assert url == f"nats://{values['fullnameOverride']}:{port}", f"{url}: not the NATS chart's Service"
    assert cfg.nats.replicas == values["config"]["cluster"]["replicas"], "streams need as many servers"


def _parse_args(argv: list[str]) -> Any:
    from deploy.cli import build_parser

    try:
        return build_parser().parse_args(argv)
    except SystemExit:
        raise AssertionError(f"motor {' '.join(argv)}: the CLI refuses these arguments") from None


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_motor_command_line_parses(overlay: str) -> None:
    objects = kustomize(overlay)
    seen = set()
    for workload, spec in pod_specs(objects):
        for c in motor_containers(spec):
            env = container_env(c, pod_names(workload)[0])
            args = _parse_args([expand(a, env) for a in c["args"]])
            assert callable(args.func)
            seen.add(args.command)
            stop = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command")
            if stop:
                assert stop[0] == "motor"
                _parse_args(stop[1:])
    assert {"controller", "coordinator", "nodeagent", "events"} <= seen


def _env_names_in_code() -> set[str]:
    """Every `MOTOR_*` name our packages mention: what some code reads."""
    names: set[str] = set()
    for pkg in ("core", "streams", "controller", "coordinator", "nodeagent", "deploy", "http1"):
        for path in (ROOT / pkg).rglob("*.py"):
            names |= set(re.findall(r"[\"'](MOTOR_[A-Z0-9_]+)[\"']", path.read_text()))
    return names


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_motor_variable_is_one_the_code_reads(overlay: str) -> None:
    from core.secrets import ENV as SECRET_ENV
    from deploy.cmd_nodeagent import ENV as AGENT_ENV
    from streams.credentials import CONTEXT_ENV

    known = _env_names_in_code()
    assert set(AGENT_ENV.values()) | set(SECRET_ENV) | {CONTEXT_ENV} <= known
    for workload, spec in pod_specs(kustomize(overlay)):
        for c in motor_containers(spec):
            names = [e["name"] for e in c.get("env", [])]
            for name in names:
                if name.startswith("MOTOR_"):
                    assert name in known, f"{workload['metadata']['name']}/{c['name']}: no code reads {name}"
            assert CONTEXT_ENV in names, f"{c['name']}: a NATS client without its login ({CONTEXT_ENV})"
            if c["args"][0] == "nodeagent":
                for var in (AGENT_ENV["node_id"], AGENT_ENV["role"], AGENT_ENV["ip"], AGENT_ENV["config"]):
                    assert var in names, f"{workload['metadata']['name']}: the node agent needs {var}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_node_agents_run_a_role_the_config_has(overlay: str) -> None:
    from deploy.cmd_nodeagent import ENV as AGENT_ENV

    objects = kustomize(overlay)
    cfg = _config(objects)
    roles = set()
    for workload, spec in pod_specs(objects):
        if _component(workload) != "nodeagent":
            continue
        (c,) = motor_containers(spec)
        env = container_env(c, pod_names(workload)[0])
        role = env[AGENT_ENV["role"]]
        assert role == workload["metadata"]["labels"]["motor/role"]
        section = cfg.section(role)
        assert section is not None, f"{workload['metadata']['name']}: the config has no {role} section"
        gpus = c["resources"].get("limits", {}).get("nvidia.com/gpu")
        if gpus is not None:  # the agent pins devices 0..n-1 of what the pod was given
            assert gpus == section.devices_per_node == c["resources"]["requests"]["nvidia.com/gpu"]
        roles.add(role)
    assert roles == {str(r) for r in cfg.sections()}, "every engine section needs its node agents"


def _mounted_file(spec: dict[str, Any], c: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """(volume, key within it) of the file at `path` in container `c`."""
    for m in c.get("volumeMounts", []):
        mount = m["mountPath"]
        if m.get("subPath") and path == mount:
            key = m["subPath"]
        elif posixpath.dirname(path) == mount:
            key = posixpath.basename(path)
        else:
            continue
        (vol,) = [v for v in spec["volumes"] if v["name"] == m["name"]]
        return vol, key
    raise AssertionError(f"{c['name']}: nothing is mounted at {path}")


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_process_finds_its_config_and_its_own_nats_login(overlay: str) -> None:
    from deploy.k8s_secrets import make_secrets, plan
    from streams.credentials import CONTEXT_ENV

    objects = kustomize(overlay)
    made = {s["metadata"]["name"]: s for s in make_secrets(plan(objects))}
    (cm,) = [o for o in by_kind(objects, "ConfigMap") if CONFIG_KEY in o.get("data", {})]
    for workload, spec in pod_specs(objects):
        for c in motor_containers(spec):
            for pod in pod_names(workload):
                env = container_env(c, pod)
                args = [expand(a, env) for a in c["args"]]
                config = env.get("MOTOR_CONFIG") or args[args.index("--config") + 1]
                vol, key = _mounted_file(spec, c, config)
                assert vol["configMap"]["name"] == cm["metadata"]["name"] and key == CONFIG_KEY
                vol, key = _mounted_file(spec, c, env[CONTEXT_ENV])
                secret = made.get(vol["secret"]["secretName"])
                assert secret is not None, f"{pod}: Secret {vol['secret']['secretName']} is not one we make"
                items = [i["key"] for i in vol["secret"].get("items", [])] or list(secret["stringData"])
                assert key in items and key in secret["stringData"], f"{pod}: no login {key}"
                user = orjson.loads(secret["stringData"][key])["user"]
                expected = LOGINS.get(args[0]) or f"nodeagent-{pod}"
                assert user == expected, f"{pod}/{c['name']} logs in as {user}, not as {expected}"
    # Nothing else is mounted from a Secret we do not make, unless it is optional.
    for _, spec in pod_specs(objects):
        for v in spec["volumes"]:
            if "secret" in v and not v["secret"].get("optional"):
                assert v["secret"]["secretName"] in made
        for c in spec.get("containers", []):
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    assert ref.get("optional") or ref["name"] in made, f"{c['name']}: {ref} is never made"


# --------------------------------------------------------------------------- ports, probes, metrics


def _routes(component: str, cfg: ClusterConfig) -> dict[int, set[str]]:
    """port -> the GET paths the component's HTTP apps serve there, from the apps themselves."""
    if component == "controller":
        from controller.http import create_app
        from controller.service import ControllerService

        app = create_app(ControllerService(cfg, controller_id="c1"))
        return {cfg.controller.port: {r.path for r in app.routes if "GET" in getattr(r, "methods", ())}}
    if component == "coordinator":
        from coordinator.context import CoordinatorContext
        from coordinator.mgmt import create_mgmt_app
        from http1.auth import PROBES

        app = create_mgmt_app(CoordinatorContext(settings=cfg.coordinator))
        mgmt = {r.path for r in app.routes if "GET" in getattr(r, "methods", ())}
        c = cfg.coordinator
        if c.mgmt_port is None:
            return {c.port: mgmt}
        return {c.port: mgmt & PROBES, c.mgmt_port: mgmt}  # the /v1 port keeps only the probes
    from nodeagent.http import HttpView, create_app
    from nodeagent.metrics import AgentMetrics

    view = HttpView(status=dict, ready=lambda: True, alive=lambda: True, metrics=AgentMetrics("n"))
    paths = {r.resource.canonical for r in create_app(view).router.routes() if r.method == "GET"}  # type: ignore[union-attr]
    return {cfg.nodeagent.port_base: paths}


def _port(c: dict[str, Any], ref: Any) -> int:
    if isinstance(ref, int):
        return ref
    (p,) = [p["containerPort"] for p in c["ports"] if p["name"] == ref]
    return int(p)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_ports_probes_and_scrapes_point_at_real_routes(overlay: str) -> None:
    objects = kustomize(overlay)
    cfg = _config(objects)
    want_ports = {
        "controller": {"http": cfg.controller.port},
        "coordinator": {"http": cfg.coordinator.port, "mgmt": cfg.coordinator.mgmt_port},
        "nodeagent": {"agent": cfg.nodeagent.port_base, "engine": cfg.nodeagent.engine_port_base},
    }
    probed: set[str] = set()
    for workload, spec in pod_specs(objects):
        component = _component(workload)
        routes = _routes(component, cfg)
        (c,) = [c for c in spec["containers"] if c["name"] == component]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        for name, port in want_ports[component].items():
            assert ports.get(name) == port, (
                f"{component}: port {name} is {ports.get(name)}, the config says {port}"
            )
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            if probe in c:
                get = c[probe]["httpGet"]
                port = _port(c, get["port"])
                assert get["path"] in routes.get(port, set()), f"{component} {probe}: {get['path']} on {port}"
                probed.add(get["path"])
        notes = workload["spec"]["template"]["metadata"]["annotations"]
        port = int(notes["prometheus.io/port"])
        assert notes["prometheus.io/path"] in routes.get(port, set()), f"{component}: no metrics on {port}"
        assert port in ports.values()
    assert {"/liveness", "/readiness", "/startup"} <= probed


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_and_service_monitors_reach_named_ports(overlay: str) -> None:
    """Services select pods with those ports; each ServiceMonitor (no CRD schema here) selects
    exactly the Service of one Motor component in its namespace, by a named port of that
    Service, on paths the component really serves there."""
    objects = kustomize(overlay)
    cfg = _config(objects)
    pods = [(w["spec"]["template"]["metadata"]["labels"], w, s) for w, s in pod_specs(objects)]
    for svc in by_kind(objects, "Service"):
        sel = svc["spec"]["selector"]
        targets = [(w, s) for labels, w, s in pods if sel.items() <= labels.items()]
        assert targets, f"Service {svc['metadata']['name']} selects no pod"
        for port in svc["spec"]["ports"]:
            for _, spec in targets:
                names = {p["name"] for c in spec["containers"] for p in c.get("ports", [])}
                assert port["targetPort"] in names, f"{svc['metadata']['name']}: no port {port['targetPort']}"
    monitors = by_kind(objects, "ServiceMonitor")
    monitored = set()
    for sm in monitors:
        assert sm["apiVersion"] == "monitoring.coreos.com/v1"
        assert sm["metadata"].get("namespace") in (None, "motor"), "a ServiceMonitor sees its own namespace"
        assert "namespaceSelector" not in sm["spec"]
        sel = sm["spec"]["selector"]["matchLabels"]
        svcs = [s for s in by_kind(objects, "Service") if sel.items() <= s["metadata"]["labels"].items()]
        components = {s["metadata"]["labels"]["app.kubernetes.io/component"] for s in svcs}
        assert len(components) == 1, (
            f"ServiceMonitor {sm['metadata']['name']} selects {components or 'nothing'}"
        )
        monitored |= components
        assert sm["spec"]["endpoints"], f"ServiceMonitor {sm['metadata']['name']}: no endpoints"
        for ep in sm["spec"]["endpoints"]:
            serving = [s for s in svcs if ep["port"] in {p["name"] for p in s["spec"]["ports"]}]
            assert serving, f"ServiceMonitor {sm['metadata']['name']}: no Service has port {ep['port']}"
            for s in serving:
                (p,) = [p for p in s["spec"]["ports"] if p["name"] == ep["port"]]
                component = s["metadata"]["labels"]["app.kubernetes.io/component"]
                served = _routes(component, cfg).get(p["port"], set())
                assert ep["path"] in served, (
                    f"{sm['metadata']['name']}: {ep['path']} is not served on {p['port']}"
                )
    if monitors:  # the component is all or nothing: every Motor process is scraped
        assert monitored == {_component(w) for w, _ in pod_specs(objects)}


def _exported_metric_names() -> set[str]:
    from coordinator.metrics import CoordinatorMetrics
    from coordinator.table import RoutingTable

    m = CoordinatorMetrics()
    m.bind_table(RoutingTable(), lambda: True)
    return {family.name for family in m.registry.collect()}


def test_the_hpa_metric_is_one_the_coordinator_exports() -> None:
    import yaml

    from deploy.cmd_wait_idle import INFLIGHT

    (hpa,) = by_kind(kustomize("smoke"), "HorizontalPodAutoscaler")
    pods_metrics = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    adapter = yaml.safe_load((K8S / "prometheus-adapter" / "values.yaml").read_text())
    rules = {r["name"]["as"]: r for r in adapter["rules"]["custom"]}
    exported = _exported_metric_names()
    assert INFLIGHT in exported  # what `motor wait-idle` waits on
    assert pods_metrics and set(pods_metrics) <= set(rules), (
        "the HPA asks for a metric the adapter does not make"
    )
    for name in pods_metrics:
        series = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)", rules[name]["seriesQuery"]).group(1)  # type: ignore[union-attr]
        assert series in exported, f"prometheus-adapter reads {series}, which the coordinator does not export"
        assert series in rules[name]["metricsQuery"]
    target = hpa["spec"]["scaleTargetRef"]
    named(kustomize("smoke"), target["kind"], target["name"])


def test_the_coordinator_prestop_waits_within_the_grace_period() -> None:
    objects = kustomize("smoke")
    cfg = _config(objects)
    dep = named(objects, "Deployment", "motor-coordinator")
    spec = dep["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    args = _parse_args(c["lifecycle"]["preStop"]["exec"]["command"][1:])
    port = int(re.match(r"http://127\.0\.0\.1:(\d+)/", args.url).group(1))  # type: ignore[union-attr]
    assert args.url.endswith("/metrics") and "/metrics" in _routes("coordinator", cfg)[port]
    # The hook's whole wait, then the coordinator's own stop, must fit before SIGKILL.
    assert args.settle + args.timeout + 10 <= spec["terminationGracePeriodSeconds"]


def test_a_frozen_coordinator_leaves_the_service_within_seconds() -> None:
    """Issue 24 item 5 in Kubernetes: a coordinator that stops answering is taken out of the
    Service by its readiness probe within seconds and restarted by its liveness probe."""
    dep = named(kustomize("smoke"), "Deployment", "motor-coordinator")
    (c,) = dep["spec"]["template"]["spec"]["containers"]

    def silent_for(probe: dict[str, Any]) -> int:
        # The worst case: it froze just after a probe answered.
        return int(probe["periodSeconds"] * probe["failureThreshold"] + probe["timeoutSeconds"])

    assert silent_for(c["readinessProbe"]) <= 6
    assert silent_for(c["livenessProbe"]) <= 20
    assert silent_for(c["readinessProbe"]) < silent_for(c["livenessProbe"])


# --------------------------------------------------------------------------- the image


def _dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_the_dockerfile_builds_what_the_manifests_run() -> None:
    import tomllib

    steps = _dockerfile()
    stages = [rest for word, rest in steps if word == "FROM"]
    assert len(stages) >= 2, "multi-stage: a build stage and a runtime stage"
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM") :]
    (user,) = [rest for word, rest in final if word == "USER"]
    uid = int(user.split(":")[0])
    assert uid != 0
    assert ("ENTRYPOINT", '["motor"]') in final
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied = set()
    for word, rest in steps:
        if word == "COPY" and not rest.startswith("--from"):
            *sources, _ = rest.split()
            for src in sources:
                assert (ROOT / src).exists(), f"Dockerfile copies {src}, which is not in the repo"
                copied.add(src.rstrip("/"))
    assert packages <= copied, f"the image misses packages {sorted(packages - copied)}"
    extras = re.findall(r'pip install "\.\[([a-z,]+)\]"', (ROOT / "Dockerfile").read_text())
    assert extras and set(extras[0].split(",")) <= set(pyproject["project"]["optional-dependencies"])
    for overlay in OVERLAYS:
        for _, spec in pod_specs(kustomize(overlay)):
            assert spec["securityContext"]["runAsUser"] == uid
            assert spec["securityContext"]["runAsNonRoot"] is True


def test_deploy_package_ships_no_python_under_k8s() -> None:
    assert not list((K8S).rglob("*.py")), "deploy/k8s holds data (manifests), not code"


def test_render_is_stable() -> None:
    """Rendering twice gives the same objects (no random names the Secrets could miss)."""
    from tests.integration.k8s_render import kustomize_text

    kustomize_text.cache_clear()
    first = kustomize("smoke")
    kustomize_text.cache_clear()
    assert kustomize("smoke") == first
