"""Who may publish and subscribe to what on NATS: one permission set per Motor role, as data.

Worked out against the real server (tests/integration/test_nats_permissions.py tries each
forbidden action with the role's own credentials):

| role | publishes | reads |
|---|---|---|
| `nodeagent-<n>` | `motor.evt.{node,endpoint,fault,snapshot,drain}.<n>`, `motor.hb.<n>`, its endpoints' KV views `$KV.motor_kvview.<n>.>`; its durable `nodeagent-<n>` (create with filter `motor.cmd.<n>.>`, info, fetch, acks) | MOTOR events only (`motor.evt.>`) |
| `controller` | `motor.cmd.>`, `motor.evt.{instance,controller,fault,precision,drain,rollout}.>`, the KV buckets `motor_leader` and `motor_checkpoints` | MOTOR, MOTOR_HB |
| `coordinator` | `motor.evt.refresh.coordinator`, `motor.evt.precision.>`, its fault decisions `motor.evt.{circuit,streams}.>`, its request records `motor.req.>` | MOTOR, MOTOR_HB, KV_motor_kvview |
| `operator` | `motor.evt.{fault,precision,drain,cordon,scale,rollout}.>` (`motor fault`, `precision`, `drain`, `uncordon`, `scale`, `restart`) | like `inspect` |
| `inspect` | nothing | every stream, consumer and KV read the `nats` CLI and `motor events` make |
| `admin` | everything (`motor up` creates the streams with it; `motor events import`) | everything |

Reading uses ephemeral push consumers created by name
(`$JS.API.CONSUMER.CREATE.<stream>.<name>[.<filter>]`), delivered to the reader's own inbox
(`_INBOX.<user>.>`), with flow control answered on `$JS.FC.<stream>.>`. The nameless legacy
form `$JS.API.CONSUMER.CREATE.<stream>` is allowed to nobody: it takes the consumer name from
the body, so it could re-point another node's durable command consumer. For the same reason
every user but node `n` is denied create, delete and fetch on `nodeagent-<n>` by name; those
deny lists are made from the node ids the cluster knows when the credentials are generated.
Nobody but `admin` may create, update, purge or delete a stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from core import subjects
from core.requestlog import ALL_REQUESTS, REQ_STREAM
from streams.definitions import (
    CHECKPOINT_BUCKET,
    HB_STREAM,
    KVVIEW_BUCKET,
    LEADER_BUCKET,
    MOTOR_STREAM,
    kv_stream,
)

JS_API = "$JS.API"
ALL_STREAMS = (
    MOTOR_STREAM,
    HB_STREAM,
    REQ_STREAM,
    kv_stream(LEADER_BUCKET),
    kv_stream(CHECKPOINT_BUCKET),
    kv_stream(KVVIEW_BUCKET),
)
# Kinds of event a node agent reports about itself (the SUBJECT of its classes in core.events).
NODE_EVENT_KINDS = ("node", "endpoint", "fault", "snapshot", "drain")  # drain: its own, on SIGTERM
# The coordinator's own fault decisions (coordinator.circuit_changed, .streams_disrupted).
COORDINATOR_KINDS = ("circuit", "streams")
# `motor fault`, `motor precision`, `motor drain`, `motor uncordon`, `motor scale`, `motor restart`
OPERATOR_KINDS = ("fault", "precision", "drain", "cordon", "scale", "rollout", "fleetop")


@dataclass(frozen=True, slots=True)
class Permissions:
    """Subjects a user may publish to and subscribe to; deny wins over allow."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    publish_deny: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NatsUser:
    """One NATS user: its name, what it is for, and its permissions (None: everything)."""

    name: str
    role: str  # admin | controller | coordinator | nodeagent | operator | inspect
    permissions: Permissions | None
    description: str = ""

    @property
    def inbox_prefix(self) -> str:
        """Where this user's replies and push deliveries go: nobody else can subscribe there."""
        return inbox_prefix(self.name)


def inbox_prefix(user: str) -> str:
    """The inbox prefix of a user (`_INBOX.<user>`)."""
    return f"_INBOX.{subjects.check_token(user, 'NATS user')}"


def durable_name(node_id: str) -> str:
    """The durable command consumer of a node (the node agent makes it)."""
    return f"nodeagent-{subjects.check_token(node_id, 'node id')}"


# --------------------------------------------------------------------------- building blocks


def _api(*parts: str) -> str:
    return ".".join((JS_API, *parts))


def _stream_info() -> list[str]:
    # ensure_streams and `js.key_value` look at every stream; the answer is settings, not data.
    return [_api("INFO"), *(_api("STREAM.INFO", s) for s in ALL_STREAMS)]


def _follow(stream: str, filter_subject: str | None = None) -> list[str]:
    """Ephemeral ordered push consumers on `stream` (streams.consumer), optionally one filter only."""
    create = (
        [_api("CONSUMER.CREATE", stream, "*", filter_subject)]
        if filter_subject
        else [
            _api("CONSUMER.CREATE", stream, "*"),
            _api("CONSUMER.CREATE", stream, "*", ">"),
        ]
    )
    return [*create, _api("CONSUMER.DELETE", stream, "*"), f"$JS.FC.{stream}.>"]


def _durable_denies(node_ids: Iterable[str], mine: str | None = None) -> list[str]:
    """Create, delete and fetch on every node's durable command consumer but `mine`."""
    out: list[str] = []
    for node in sorted(set(node_ids)):
        if node == mine:
            continue
        name = durable_name(node)
        out += [
            _api("CONSUMER.CREATE", MOTOR_STREAM, name),
            _api("CONSUMER.CREATE", MOTOR_STREAM, name, ">"),
            _api("CONSUMER.DELETE", MOTOR_STREAM, name),
            _api("CONSUMER.MSG.NEXT", MOTOR_STREAM, name),
        ]
    return out


def _kv(bucket: str) -> list[str]:
    """Read and write one KV bucket (puts, guarded updates, deletes, direct gets)."""
    return [
        f"$KV.{bucket}.>",
        _api("DIRECT.GET", kv_stream(bucket), ">"),
        _api("STREAM.MSG.GET", kv_stream(bucket)),
    ]


def _perms(user: str, publish: list[str], denies: list[str], subscribe: Iterable[str] = ()) -> Permissions:
    return Permissions(
        publish=tuple(dict.fromkeys(publish)),
        subscribe=(f"{inbox_prefix(user)}.>", *subscribe),
        publish_deny=tuple(dict.fromkeys(denies)),
    )


# --------------------------------------------------------------------------- roles


def node_agent(node_id: str, node_ids: Iterable[str]) -> NatsUser:
    """Node `node_id`: its own events and heartbeats, its own command consumer, MOTOR events."""
    name = durable_name(node_id)
    evt = [subjects.event(kind, node_id) for kind in NODE_EVENT_KINDS]
    own_consumer = [
        _api("CONSUMER.CREATE", MOTOR_STREAM, name, subjects.node_commands(node_id)),
        _api("CONSUMER.INFO", MOTOR_STREAM, name),
        _api("CONSUMER.MSG.NEXT", MOTOR_STREAM, name),
        f"$JS.ACK.{MOTOR_STREAM}.{name}.>",
    ]
    publish = [
        *evt,
        subjects.heartbeat(node_id),
        # Its own endpoints' KV views only (the keys are `<node>.<endpoint>`).
        f"$KV.{KVVIEW_BUCKET}.{node_id}.>",
        *_stream_info(),
        *own_consumer,
        *_follow(MOTOR_STREAM, subjects.ALL_EVENTS),
    ]
    return NatsUser(
        name,
        "nodeagent",
        _perms(name, publish, _durable_denies(node_ids, mine=node_id)),
        f"node agent of {node_id}: its own events, heartbeats and commands",
    )


def controller(node_ids: Iterable[str]) -> NatsUser:
    """Controllers (leader and standbys share it): commands, decisions, the lease, checkpoints."""
    evt = subjects.EVT
    publish = [
        subjects.ALL_COMMANDS,
        f"{evt}.instance.>",
        f"{evt}.controller.>",
        f"{evt}.fault.>",
        f"{evt}.drain.>",  # scale-down and rolling-restart drains
        f"{evt}.rollout.>",
        f"{evt}.fleetop.>",  # a fleet operation's summary
        f"{evt}.precision.>",
        *_stream_info(),
        *_follow(MOTOR_STREAM),
        *_follow(HB_STREAM),
        # The appender reads a subject's last sequence before a guarded append.
        _api("STREAM.MSG.GET", MOTOR_STREAM),
        _api("DIRECT.GET", MOTOR_STREAM, ">"),
        *_kv(LEADER_BUCKET),
        *_kv(CHECKPOINT_BUCKET),
    ]
    return NatsUser(
        "controller", "controller", _perms("controller", publish, _durable_denies(node_ids)), "controllers"
    )


def coordinator(node_ids: Iterable[str]) -> NatsUser:
    """Coordinators: refresh and precision events and their own fault decisions; reads the log."""
    publish = [
        subjects.REFRESH,
        f"{subjects.EVT}.precision.>",
        *(f"{subjects.EVT}.{kind}.>" for kind in COORDINATOR_KINDS),
        ALL_REQUESTS,  # its per-request routing records, to MOTOR_REQ
        *_stream_info(),
        *_follow(MOTOR_STREAM),
        *_follow(HB_STREAM),
        *_follow(kv_stream(KVVIEW_BUCKET)),
    ]
    return NatsUser(
        "coordinator",
        "coordinator",
        _perms("coordinator", publish, _durable_denies(node_ids)),
        "coordinators",
    )


def _read_all() -> list[str]:
    return [
        *_stream_info(),
        _api("STREAM.INFO", "*"),
        _api("STREAM.LIST"),
        _api("STREAM.NAMES"),
        _api("STREAM.MSG.GET", "*"),
        _api("DIRECT.GET", ">"),
        _api("CONSUMER.INFO", "*", "*"),
        _api("CONSUMER.LIST", "*"),
        _api("CONSUMER.NAMES", "*"),
        _api("CONSUMER.CREATE", "*", "*"),
        _api("CONSUMER.CREATE", "*", "*", ">"),
        _api("CONSUMER.DELETE", "*", "*"),
        _api("CONSUMER.MSG.NEXT", "*", "*"),
        "$JS.FC.>",
    ]


def inspect(node_ids: Iterable[str]) -> NatsUser:
    """Read-only: what `motor events`, `motor status`, `motor replay` and the `nats` CLI read."""
    return NatsUser(
        "inspect",
        "inspect",
        _perms("inspect", _read_all(), _durable_denies(node_ids), subscribe=(f"{subjects.PREFIX}.>",)),
        "read-only: motor events/status/replay, the nats CLI",
    )


def operator(node_ids: Iterable[str]) -> NatsUser:
    """Operators: read like `inspect`, and report or clear faults and precision alarms."""
    publish = [
        *(f"{subjects.EVT}.{kind}.>" for kind in OPERATOR_KINDS),
        *_read_all(),
    ]
    return NatsUser(
        "operator",
        "operator",
        _perms("operator", publish, _durable_denies(node_ids), subscribe=(f"{subjects.PREFIX}.>",)),
        "motor fault/precision/drain/uncordon/scale/restart, and everything inspect reads",
    )


def admin() -> NatsUser:
    """Everything: `motor up` creates the streams with it; `motor events import` writes with it."""
    return NatsUser("admin", "admin", None, "everything: streams, imports")


def cluster_users(node_ids: Iterable[str]) -> list[NatsUser]:
    """Every user of a cluster with these nodes."""
    nodes = sorted(set(node_ids))
    return [
        admin(),
        controller(nodes),
        coordinator(nodes),
        operator(nodes),
        inspect(nodes),
        *(node_agent(n, nodes) for n in nodes),
    ]
