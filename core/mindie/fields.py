"""The leaves of the MindIE catalog (mapped, unused, free-form) and the reasons a field is unused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

Kind = Literal["int", "number", "bool", "str", "str_list"]


@dataclass(frozen=True, slots=True)
class Map:
    """A field Motor consumes; `target` is the Motor field (see core/mindie/mapping.py)."""

    target: str
    kind: Kind


@dataclass(frozen=True, slots=True)
class Unused:
    """A field accepted for compatibility and not consumed."""

    reason: str


@dataclass(frozen=True, slots=True)
class Free:
    """An object whose keys are not checked: the engine's flags, Kubernetes labels, env vars."""

    target: str | None  # Motor field when consumed, None when unused
    reason: str = ""


Node: TypeAlias = "Map | Unused | Free | dict[str, Node]"

K8S = "Kubernetes deployment (deploy.py): Motor runs processes (`motor up`, or your supervisor), not pods"
LOGGING = "logging: Motor's processes log to stderr; engine logs go to `nodeagent.log_dir`"
ETCD = "etcd: Motor's state is the JetStream log (`nats`)"
STANDBY = (
    "leader election is a JetStream KV lease (`controller.lease_ttl`); `motor up` runs a hot "
    "standby controller; coordinators are stateless replicas"
)
TLS = "HTTP TLS is not terminated by Motor (put it in front); the bus's TLS is `nats.tls`"
PORTS = "port allocation: engine ports come from `nodeagent.engine_port_base`, one per endpoint"
CTRL_POLL = "the controller reacts to log events; its timers tick every `controller.tick_interval`"
EVENTS = "events reach the controller and coordinators through JetStream consumers: no polling, no heartbeat between them"
VIRTUAL = "legacy EngineServer virtual inference: accepted for compatibility, not consumed by native engines (seed 002)"
DERIVED = (
    "derived by Motor from the engine blocks and the start command (roles, endpoints, ports, parallel sizes)"
)
KV_POOL = (
    "KV pooling / KV conductor services are not deployed by Motor; configure the connector in engine_config"
)
NM_REMOTE = "node agents reach the controller through NATS, not HTTP"
NM_PER_ROLE = (
    "per-role node manager address/ports: Motor's are cluster-wide (`nodeagent.*`, from the "
    "top-level motor_nodemanger_config) and per-node flags (`motor nodeagent --ip/--port`)"
)
NOT_MODELLED = "not implemented in Motor"
STREAM_CONTINUE = "Motor's coordinator always continues a stream whose decode died (mid-stream continuation)"
DEPLOYER_RUNTIME = "written by the deployer at runtime"
POLICY_INTERNALS = (
    "scheduler internals: Motor's policies are round_robin, least_load, power_of_two, prefix_affinity"
)

LOGGING_CONFIG = Free(None, LOGGING)
TLS_CONFIG = Free(None, TLS)
PORT_ALLOCATOR = Free(None, PORTS)
ETCD_CONFIG = Free(None, ETCD)
STANDBY_CONFIG = Free(None, STANDBY)
