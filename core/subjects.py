"""The only place that formats or parses NATS subjects.

Subjects name the entity last so `motor.evt.*.n7` filters work:
`motor.evt.<kind>.<entity>`, `motor.cmd.<node>.<verb>`, `motor.hb.<node>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

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


def check_token(value: str, what: str = "token") -> str:
    """Validate one subject token (node ids, entity ids): no dots, spaces or wildcards."""
    if not _TOKEN.match(value):
        raise SubjectError(f"{what} {value!r} is not a valid subject token (use A-Z a-z 0-9 _ -)")
    return value


def event(kind: str, entity: str | int) -> str:
    return f"{EVT}.{check_token(kind, 'kind')}.{check_token(str(entity), 'entity')}"


def endpoint_entity(node_id: str | None, instance_id: int | None) -> str:
    """The subject entity of a coordinator event about an endpoint: its node, else `ext-<id>`."""
    if node_id is not None:
        return node_id
    return f"ext-{instance_id if instance_id is not None else 'unknown'}"


LEADER = f"{EVT}.controller.leader"
REFRESH = f"{EVT}.refresh.coordinator"


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


# --------------------------------------------------------------------------- placements
# Each event class names where it is published (`EventBase.SUBJECT`) with one of these; the
# entity comes from the event's data.


class Placement(Protocol):
    """Where events of one class are published, given their data."""

    def subject(self, data: Any) -> str:
        """The subject for this data; SubjectError when the data names no valid entity."""
        ...

    def holds(self, subject: str, data: Any) -> bool:
        """Whether `subject` is this data's subject (cheap: every folded event is checked)."""
        ...


@dataclass(frozen=True, slots=True)
class ByField:
    """`<prefix><entity><suffix>`, the entity named by one field of the data."""

    prefix: str
    field: str
    suffix: str = ""
    what: str = "entity"  # names the token in an error

    def subject(self, data: Any) -> str:
        entity = check_token(str(getattr(data, self.field)), self.what)
        return f"{self.prefix}{entity}{self.suffix}"

    def holds(self, subject: str, data: Any) -> bool:
        return subject == f"{self.prefix}{getattr(data, self.field)}{self.suffix}"


@dataclass(frozen=True, slots=True)
class ByEndpoint:
    """`motor.evt.<kind>.<node>`, or `ext-<instance id>` for an engine registered without a node
    (the coordinator's decisions about an endpoint)."""

    kind: str

    def subject(self, data: Any) -> str:
        return event(self.kind, endpoint_entity(data.node_id, data.instance_id))

    def holds(self, subject: str, data: Any) -> bool:
        try:
            return subject == self.subject(data)
        except SubjectError:
            return True  # no subject to hold it to: not judged


@dataclass(frozen=True, slots=True)
class Fixed:
    """One subject for every event of the class (there is one such entity)."""

    value: str

    def subject(self, data: Any) -> str:
        return self.value

    def holds(self, subject: str, data: Any) -> bool:
        return subject == self.value


def about(kind: str, field: str) -> ByField:
    """`motor.evt.<kind>.<data.field>`."""
    return ByField(f"{EVT}.{check_token(kind, 'kind')}.", field)


def to_node(verb: str) -> ByField:
    """`motor.cmd.<data.node_id>.<verb>`: a command addressed to one node."""
    return ByField(f"{CMD}.", "node_id", f".{check_token(verb, 'verb')}", "node id")


HEARTBEAT = ByField(f"{HB}.", "node_id", what="node id")


def matches(subject: str, ev: Any) -> bool:
    """Whether `subject` is the one `ev` is published on (`for_event`), checked cheaply: every
    event a reader folds passes here. A subject outside Motor's (another stream read the same
    way), or an object that names no placement, is not judged."""
    if not subject.startswith(_OURS):
        return True
    try:
        placement: Placement = ev.SUBJECT
    except AttributeError:
        return True
    return placement.holds(subject, ev.data)


def for_event(ev: Any) -> str:
    """The subject an event is published on: its class's `SUBJECT` placement of its data."""
    placement: Placement | None = getattr(ev, "SUBJECT", None)
    if placement is None:
        raise SubjectError(f"no subject for event type {getattr(ev, 'type', type(ev).__name__)!r}")
    return placement.subject(ev.data)


def kv_view_key(node_id: str, endpoint_id: int) -> str:
    """The `motor_kvview` bucket key of one endpoint's KV view: `<node>.<endpoint>`, so a node
    agent's NATS permission can be its own node's keys (`$KV.motor_kvview.<node>.>`)."""
    return f"{check_token(node_id, 'node id')}.{int(endpoint_id)}"


def kv_view_endpoint(key: str) -> str | None:
    """The routing table's endpoint key (`<node>/<endpoint>`) of a KV view key; None if malformed."""
    node_id, dot, ep = key.rpartition(".")
    if not dot or not _TOKEN.match(node_id) or not ep.isdigit():
        return None
    return f"{node_id}/{int(ep)}"
