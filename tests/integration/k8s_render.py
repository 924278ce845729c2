"""Render deploy/k8s with the real kubectl (kustomize), and validate what comes out.

kubectl comes from `just k8s-tools` (deploy/k8s_tools.py) into the venv; `just test`
installs it first. Every built-in object is checked against the Kubernetes OpenAPI schemas
of `kubernetes-validate` (strict: an unknown field fails).

Custom resources (the Prometheus Operator's ServiceMonitors) have no schema here: their CRD
schemas are the operator's, not ours, and are not copied into this repository. For them
`validate` checks only the fields our manifests use (a list written here, not the CRD's
schema) and the metadata; the tests check their wiring (selectors, ports, paths) instead.

The NATS chart is not rendered here either (it is not ours and no package we install ships
it): what we own, deploy/k8s/nats/values.yaml, is read as data (`nats_values`).
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir() if (p / "kustomization.yaml").is_file())
NATS_VALUES = K8S / "nats" / "values.yaml"
# The oldest Kubernetes the manifests claim (PodDisruptionBudget.unhealthyPodEvictionPolicy is
# GA in 1.31) and the newest schemas kubernetes-validate has.
K8S_VERSIONS = ("1.31.0", kubernetes_validate.latest_version())
MOTOR_IMAGE = re.compile(r"^motor-jetstream(-[a-z]+)?(:|$)")


def tool(name: str) -> str:
    """Path of kubectl: the venv's (from `just k8s-tools`) first, then PATH."""
    for cand in (Path(sys.executable).parent / name,):
        if cand.is_file():
            return str(cand)
    found = shutil.which(name)
    assert found, f"{name} is missing: run `just k8s-tools` (`just test` does) to install it into the venv"
    return found


def _run(argv: list[str]) -> str:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{proc.stderr}"
    return proc.stdout


def docs(text: str) -> list[dict[str, Any]]:
    """The objects of a YAML stream."""
    return [d for d in yaml.safe_load_all(text) if d]


@functools.cache
def kustomize_text(overlay: str) -> str:
    """`kubectl kustomize deploy/k8s/overlays/<overlay>` as text."""
    return _run([tool("kubectl"), "kustomize", str(K8S / "overlays" / overlay)])


def kustomize(overlay: str) -> list[dict[str, Any]]:
    """The objects of an overlay, rendered by the real kustomize."""
    return docs(kustomize_text(overlay))


def nats_values() -> dict[str, Any]:
    """deploy/k8s/nats/values.yaml, our values for the official NATS chart."""
    values = yaml.safe_load(NATS_VALUES.read_text())
    assert isinstance(values, dict), f"{NATS_VALUES}: not a mapping"
    return values


# The fields of each custom resource our manifests use, nested as in the object; a list is a
# list of such objects. Written here from what the manifests need, not copied from the CRD's
# schema: a key outside it is a typo, or a field no test checks yet (add it with its check).
CUSTOM_RESOURCES: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "spec": {
            "selector": {"matchLabels": None},
            "endpoints": [{"port": None, "path": None, "interval": None}],
        }
    },
}
DURATION = re.compile(r"[0-9]+(ms|s|m|h)")


def _known_fields(value: Any, fields: Any, where: str) -> None:
    if fields is None:
        return
    if isinstance(fields, list):
        assert isinstance(value, list), f"{where}: expected a list"
        for i, item in enumerate(value):
            _known_fields(item, fields[0], f"{where}[{i}]")
        return
    assert isinstance(value, dict), f"{where}: expected a mapping"
    for key, item in value.items():
        assert key in fields, f"{where}: unknown field {key!r} (known here: {sorted(fields)})"
        _known_fields(item, fields[key], f"{where}.{key}")


def _validate_custom(obj: Mapping[str, Any], fields: dict[str, Any], version: str, name: str) -> None:
    """What can be checked of a custom resource without its CRD's schema."""
    unknown = set(obj) - {"apiVersion", "kind", "metadata", "spec"}
    assert not unknown, f"{name}: unknown fields {sorted(unknown)}"
    _known_fields(obj.get("spec"), fields["spec"], f"{name} spec")
    # The metadata is an ordinary ObjectMeta: validate it as that of a built-in object.
    meta = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": obj.get("metadata")}
    try:
        kubernetes_validate.validate(meta, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{name} metadata: {exc.message} at {list(exc.path)}") from None
    for ep in (obj.get("spec") or {}).get("endpoints", []):
        interval = ep.get("interval")
        assert interval is None or DURATION.fullmatch(interval), f"{name}: interval {interval!r}"


def validate(obj: Mapping[str, Any], version: str) -> None:
    """Fail with the object's name and the schema's words if it is not a valid object."""
    api, kind = obj.get("apiVersion", ""), obj.get("kind", "")
    name = f"{kind}/{(obj.get('metadata') or {}).get('name')}"
    custom = CUSTOM_RESOURCES.get((api, kind))
    if custom is not None:
        _validate_custom(obj, custom, version, name)
        return
    try:
        kubernetes_validate.validate(dict(obj), version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{name} on Kubernetes {version}: {exc.message} at {list(exc.path)}") from None
    except kubernetes_validate.SchemaNotFoundError:
        raise AssertionError(
            f"{name}: no schema for {api} {kind}; a custom resource needs its fields in "
            "k8s_render.CUSTOM_RESOURCES and a test of its wiring"
        ) from None


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The objects of one kind."""
    return [o for o in objects if o.get("kind") == kind]


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    """The one object of this kind and name."""
    found = [o for o in by_kind(objects, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, pod spec) of every Deployment and StatefulSet."""
    for o in objects:
        if o["kind"] in ("Deployment", "StatefulSet"):
            yield o, o["spec"]["template"]["spec"]


def motor_containers(spec: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The containers (init containers included) that run Motor's image."""
    for c in [*spec.get("initContainers", []), *spec.get("containers", [])]:
        if MOTOR_IMAGE.match(c["image"]):
            yield c


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion of args and env values."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), text)


def container_env(c: Mapping[str, Any], pod_name: str, pod_ip: str = "10.0.0.7") -> dict[str, str]:
    """The container's environment as the kubelet would set it (field refs resolved)."""
    fields = {"metadata.name": pod_name, "status.podIP": pod_ip, "metadata.namespace": "motor"}
    env: dict[str, str] = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = expand(e["value"], env)
        elif "fieldRef" in e.get("valueFrom", {}):
            env[e["name"]] = fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def pod_names(workload: Mapping[str, Any]) -> list[str]:
    """Names of the pods a workload makes (a Deployment's: one example name)."""
    name = workload["metadata"]["name"]
    if workload["kind"] == "StatefulSet":
        return [f"{name}-{i}" for i in range(workload["spec"].get("replicas", 1))]
    return [f"{name}-5d8f7c9b4-x2x7q"]
