"""The only place that formats or parses NATS subjects.

Subjects name the entity last so `motor.evt.*.n7` filters work:
`motor.evt.<kind>.<entity>`, `motor.cmd.<node>.<verb>`, `motor.hb.<node>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from core.errors import SubjectError

PREFIX = "motor"
EVT = f"{PREFIX}.evt"
CMD = f"{PREFIX}.cmd"
HB = f"{PREFIX}.hb"

ALL_EVENTS = f"{EVT}.>"
ALL_COMMANDS = f"{CMD}.>"
ALL_HEARTBEATS = f"{HB}.>"
_OURS = f"{PREFIX}."

_TOKEN = re.compile(r"^[A-Za-z0-9_\-]+$")

# event type -> subject kind; the entity comes from the event's data.
_KIND_BY_TYPE = {
    "node.registered": "node",
    "node.deregistered": "node",
    "command.applied": "node",
    "command.refused": "node",
    "endpoint.status_changed": "endpoint",
    "fault.reported": "fault",
    "fault.cleared": "fault",
    "precision.alarm_raised": "precision",
    "precision.alarm_cleared": "precision",
    "snapshot.checkpoint": "snapshot",
    "instance.assembled": "instance",
    "instance.state_changed": "instance",
    "controller.leader_changed": "controller",
    "instances.refreshed": "refresh",
    "coordinator.circuit_changed": "circuit",
    "coordinator.streams_disrupted": "streams",
}
# The coordinator's fault decisions are about an endpoint: its node names the subject, or, for an
# engine registered through the refresh API (no node), `ext-<instance id>`.
_ENDPOINT_KINDS = frozenset({"circuit", "streams"})


# event type -> (subject prefix, data attribute naming the entity): `matches`'s fast path for
# the kinds `for_event` places this way; any other type is judged by `for_event` itself.
_ENTITY_ATTR = {
    "node": "node_id",
    "endpoint": "node_id",
    "fault": "node_id",
    "snapshot": "node_id",
    "instance": "instance_id",
    "precision": "d_instance_id",
}
_PREFIX_BY_TYPE: dict[str, tuple[str, str]] = {
    **{
        t: (f"{EVT}.{kind}.", _ENTITY_ATTR[kind]) for t, kind in _KIND_BY_TYPE.items() if kind in _ENTITY_ATTR
    },
    "node.heartbeat": (f"{HB}.", "node_id"),
}


def check_token(value: str, what: str = "token") -> str:
    """Validate one subject token (node ids, entity ids): no dots, spaces or wildcards."""
    if not _TOKEN.match(value):
        raise SubjectError(f"{what} {value!r} is not a valid subject token (use A-Z a-z 0-9 _ -)")
    return value


def event(kind: str, entity: str | int) -> str:
    return f"{EVT}.{check_token(kind, 'kind')}.{check_token(str(entity), 'entity')}"


def node(node_id: str) -> str:
    return event("node", node_id)


def endpoint(node_id: str) -> str:
    return event("endpoint", node_id)


def instance(instance_id: int) -> str:
    return event("instance", instance_id)


def fault(node_id: str) -> str:
    return event("fault", node_id)


def precision(d_instance_id: int) -> str:
    return event("precision", d_instance_id)


def snapshot(node_id: str) -> str:
    return event("snapshot", node_id)


def endpoint_entity(node_id: str | None, instance_id: int | None) -> str:
    """The subject entity of a coordinator event about an endpoint: its node, else `ext-<id>`."""
    if node_id is not None:
        return node_id
    return f"ext-{instance_id if instance_id is not None else 'unknown'}"


def circuit(node_id: str | None, instance_id: int | None = None) -> str:
    """Where a coordinator says it opened or closed an endpoint's circuit."""
    return event("circuit", endpoint_entity(node_id, instance_id))


def streams(node_id: str | None, instance_id: int | None = None) -> str:
    """Where a coordinator says what streams on an endpoint went through."""
    return event("streams", endpoint_entity(node_id, instance_id))


LEADER = f"{EVT}.controller.leader"
REFRESH = f"{EVT}.refresh.coordinator"


def command(node_id: str, verb: str) -> str:
    return f"{CMD}.{check_token(node_id, 'node id')}.{check_token(verb, 'verb')}"


def node_commands(node_id: str) -> str:
    """Filter for every command addressed to one node."""
    return f"{CMD}.{check_token(node_id, 'node id')}.>"


def heartbeat(node_id: str) -> str:
    return f"{HB}.{check_token(node_id, 'node id')}"


@dataclass(frozen=True, slots=True)
class Parsed:
    family: str  # "evt" | "cmd" | "hb"
    kind: str  # event kind, command verb, or "hb"
    entity: str  # entity id, or node id for commands and heartbeats


def parse(subject: str) -> Parsed:
    """Split a Motor subject into family, kind and entity; raise SubjectError otherwise."""
    parts = subject.split(".")
    if len(parts) < 3 or parts[0] != PREFIX:
        raise SubjectError(f"not a motor subject: {subject!r}")
    family = parts[1]
    if family == "evt" and len(parts) == 4:
        return Parsed("evt", parts[2], parts[3])
    if family == "cmd" and len(parts) == 4:
        return Parsed("cmd", parts[3], parts[2])
    if family == "hb" and len(parts) == 3:
        return Parsed("hb", "hb", parts[2])
    raise SubjectError(f"malformed motor subject: {subject!r}")


def matches(subject: str, ev: Any) -> bool:
    """Whether `subject` is the one `ev` is published on (`for_event`), checked cheaply: every
    event a reader folds passes here. A type `for_event` cannot place, or a subject outside
    Motor's (another stream read the same way), is not judged."""
    if not subject.startswith(_OURS):
        return True
    etype: str = ev.type
    rule = _PREFIX_BY_TYPE.get(etype)
    if rule is not None:
        return subject == f"{rule[0]}{getattr(ev.data, rule[1])}"
    if etype in ("command.start", "command.stop"):
        return subject == f"{CMD}.{ev.data.node_id}.{etype[8:]}"
    try:
        return subject == for_event(ev)
    except (SubjectError, AttributeError):
        return True


def for_event(ev: Any) -> str:
    """The subject an event is published on, from its type and data."""
    etype: str = ev.type
    data = ev.data
    if etype == "node.heartbeat":
        return heartbeat(data.node_id)
    if etype == "command.start":
        return command(data.node_id, "start")
    if etype == "command.stop":
        return command(data.node_id, "stop")
    if etype == "controller.leader_changed":
        return LEADER
    if etype == "instances.refreshed":
        return REFRESH
    kind = _KIND_BY_TYPE.get(etype)
    if kind is None:
        raise SubjectError(f"no subject for event type {etype!r}")
    if kind in ("instance",):
        return instance(data.instance_id)
    if kind == "precision":
        return precision(data.d_instance_id)
    if kind in _ENDPOINT_KINDS:
        return event(kind, endpoint_entity(data.node_id, data.instance_id))
    return event(kind, data.node_id)
