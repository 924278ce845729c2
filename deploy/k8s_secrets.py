"""The NATS logins of a Kubernetes deployment as Secrets, made from its rendered manifests.

One NATS user per role, with the permissions `streams.permissions` builds, as `motor up`
makes them for its own server (deploy/natsauth.py); here they become three Secrets:

| Secret | keys | mounted by |
|---|---|---|
| `motor-nats-auth` | `auth.conf`: the server's `authorization` block, passwords included | the NATS servers (deploy/k8s/nats/values.yaml includes it) |
| `motor-nats-clients` | `controller.json`, `coordinator.json`, `admin.json`, `operator.json`, `inspect.json` | each pod its own file (`MOTOR_NATS_CONTEXT`) |
| `motor-nats-nodeagents` | `nodeagent-<node>.json`, one a node agent pod | the node agent pods |

The node ids are the pod names of the node agent StatefulSets (`<name>-<ordinal>` for each
replica) and the server URL is the config map's `nats.urls`, both read from the manifests,
so the users cannot drift from what is deployed. Passwords are new unless an earlier output
is given to keep them (adding a node must not log everyone else out).
"""

from __future__ import annotations

import base64
import binascii
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import yaml

from core.config import ClusterConfig
from core.configfile import parse_config
from core.errors import ConfigError
from streams.credentials import Credentials
from streams.permissions import NatsUser, cluster_users
from streams.server import authorization_conf

SERVER_SECRET = "motor-nats-auth"
SERVER_KEY = "auth.conf"
CLIENTS_SECRET = "motor-nats-clients"
NODEAGENTS_SECRET = "motor-nats-nodeagents"
CONFIG_KEY = "motor.yaml"
COMPONENT_LABEL = "app.kubernetes.io/component"
NODEAGENT = "nodeagent"
LABELS = {"app.kubernetes.io/name": "motor", "app.kubernetes.io/part-of": "motor"}


class ManifestError(Exception):
    """The manifests (or an earlier output) cannot be used; the message names the object."""


@dataclass(frozen=True, slots=True)
class Plan:
    """What the Secrets are made for: the namespace, the node ids, the config."""

    namespace: str | None
    node_ids: tuple[str, ...]
    config: ClusterConfig


def load_objects(text: str, source: str) -> list[dict[str, Any]]:
    """The Kubernetes objects of a YAML stream (empty documents skipped)."""
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise ManifestError(f"{source}: not valid YAML: {exc}") from None
    out: list[dict[str, Any]] = []
    for i, doc in enumerate(docs):
        if doc is None:
            continue
        if not isinstance(doc, dict) or not isinstance(doc.get("kind"), str):
            raise ManifestError(f"{source}: document {i + 1} is not a Kubernetes object (no kind)")
        if doc["kind"] == "List":  # what `kubectl get ... -o yaml` prints
            out += [item for item in doc.get("items") or [] if isinstance(item, dict)]
        else:
            out.append(doc)
    return out


def _name(obj: Mapping[str, Any]) -> str:
    return f"{obj.get('kind')}/{(obj.get('metadata') or {}).get('name', '?')}"


def node_ids(objects: Iterable[Mapping[str, Any]]) -> list[str]:
    """The pod names of every node agent StatefulSet: the Motor node ids."""
    ids: list[str] = []
    for obj in objects:
        if obj.get("kind") != "StatefulSet":
            continue
        spec = obj.get("spec") or {}
        labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        if labels.get(COMPONENT_LABEL) != NODEAGENT:
            continue
        name = (obj.get("metadata") or {}).get("name")
        replicas = spec.get("replicas", 1)
        if not isinstance(name, str) or not name:
            raise ManifestError(f"{_name(obj)}: metadata.name is missing")
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ManifestError(
                f"{_name(obj)}: spec.replicas must be a non-negative integer, got {replicas!r}"
            )
        ids += [f"{name}-{i}" for i in range(replicas)]
    return ids


def motor_config(objects: Iterable[Mapping[str, Any]]) -> ClusterConfig:
    """The cluster config of the one ConfigMap holding `motor.yaml`, validated."""
    found = [o for o in objects if o.get("kind") == "ConfigMap" and CONFIG_KEY in ((o.get("data")) or {})]
    if len(found) != 1:
        raise ManifestError(f"expected one ConfigMap with a {CONFIG_KEY} key, found {len(found)}")
    try:
        return parse_config(found[0]["data"][CONFIG_KEY], f"{_name(found[0])} {CONFIG_KEY}")
    except ConfigError as exc:
        raise ManifestError(str(exc)) from None


def plan(objects: list[dict[str, Any]], namespace: str | None = None) -> Plan:
    """Node ids, namespace and config of a rendered deployment."""
    ids = node_ids(objects)
    if not ids:
        raise ManifestError(f"no StatefulSet with pod label {COMPONENT_LABEL}={NODEAGENT}: no node agents")
    if len(set(ids)) != len(ids):
        raise ManifestError(f"two node agent pods would have the same name: {sorted(ids)}")
    if namespace is None:
        spaces = {(o.get("metadata") or {}).get("namespace") for o in objects if o.get("kind") != "Namespace"}
        if len(spaces) > 1:
            raise ManifestError(f"the objects are in more than one namespace: {sorted(map(str, spaces))}")
        namespace = next(iter(spaces), None)
    return Plan(namespace, tuple(ids), motor_config(objects))


def kept_passwords(objects: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """user -> password, from the context files in an earlier output's Secrets."""
    out: dict[str, str] = {}
    for obj in objects:
        if obj.get("kind") != "Secret" or (obj.get("metadata") or {}).get("name") not in (
            CLIENTS_SECRET,
            NODEAGENTS_SECRET,
        ):
            continue
        files: dict[str, str] = dict(obj.get("stringData") or {})
        for key, value in (obj.get("data") or {}).items():
            try:
                files[key] = base64.b64decode(value, validate=True).decode()
            except (binascii.Error, UnicodeDecodeError, TypeError):
                raise ManifestError(f"{_name(obj)}: data.{key} is not base64 text") from None
        for key, text in files.items():
            try:
                ctx = orjson.loads(text)
            except orjson.JSONDecodeError:
                raise ManifestError(f"{_name(obj)}: {key} is not a NATS context (JSON)") from None
            if isinstance(ctx, dict) and ctx.get("user") and ctx.get("password"):
                out[str(ctx["user"])] = str(ctx["password"])
    return out


def _context(user: NatsUser, password: str, url: str) -> str:
    creds = Credentials(url=url, user=user.name, password=password, inbox_prefix=user.inbox_prefix)
    text = orjson.dumps(creds.to_context(f"Kubernetes: {user.description}"), option=orjson.OPT_INDENT_2)
    return text.decode() + "\n"


def _secret(name: str, namespace: str | None, data: dict[str, str], about: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": dict(LABELS), "annotations": {"motor/about": about}}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque", "stringData": data}


def make_secrets(
    p: Plan,
    keep: Mapping[str, str] | None = None,
    new_password: Callable[[], str] = lambda: secrets.token_urlsafe(24),
) -> list[dict[str, Any]]:
    """The three Secrets of plan `p`; users in `keep` keep their password."""
    keep = keep or {}
    users = [(u, keep.get(u.name) or new_password()) for u in cluster_users(p.node_ids)]
    url = ",".join(p.config.nats.urls)
    clients = {f"{u.name}.json": _context(u, pw, url) for u, pw in users if u.role != NODEAGENT}
    agents = {f"{u.name}.json": _context(u, pw, url) for u, pw in users if u.role == NODEAGENT}
    return [
        _secret(
            SERVER_SECRET,
            p.namespace,
            {SERVER_KEY: authorization_conf(users) + "\n"},
            "the NATS servers' users and permissions (included by deploy/k8s/nats/values.yaml)",
        ),
        _secret(
            CLIENTS_SECRET,
            p.namespace,
            clients,
            "NATS logins of controller, coordinator, admin, operator, inspect",
        ),
        _secret(NODEAGENTS_SECRET, p.namespace, agents, "NATS logins of the node agents, one a pod"),
    ]


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as `|` blocks, so the Secrets stay readable."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump(objects: list[dict[str, Any]]) -> str:
    """A YAML stream of the objects."""
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False)
