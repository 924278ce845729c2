"""Where an event of a kind is published, for a test that publishes something else there (a
malformed event, a stray, a forgery) or reads through a filter: the subject the event class's
placement gives for that entity. `core.subjects` formats every one; production asks the class
(`subjects.for_event`), so these shortcuts are the tests'."""

from __future__ import annotations

from types import SimpleNamespace

from core.events import (
    CircuitChanged,
    EndpointStatusChanged,
    EventBase,
    FaultReported,
    InstanceAssembled,
    NodeRegistered,
    StartCommand,
    StopCommand,
    StreamsDisrupted,
)

VERBS: dict[str, type[EventBase]] = {"start": StartCommand, "stop": StopCommand}


def _of(cls: type[EventBase], **data: object) -> str:
    return cls.SUBJECT.subject(SimpleNamespace(**data))


def node(node_id: str) -> str:
    """`motor.evt.node.<node_id>`: registrations, deregistrations, command answers."""
    return _of(NodeRegistered, node_id=node_id)


def endpoint(node_id: str) -> str:
    """`motor.evt.endpoint.<node_id>`: endpoint status changes."""
    return _of(EndpointStatusChanged, node_id=node_id)


def instance(instance_id: int) -> str:
    """`motor.evt.instance.<instance_id>`."""
    return _of(InstanceAssembled, instance_id=instance_id)


def fault(node_id: str) -> str:
    """`motor.evt.fault.<node_id>`: faults reported and cleared."""
    return _of(FaultReported, node_id=node_id)


def circuit(node_id: str | None, instance_id: int | None = None) -> str:
    """Where a coordinator says it opened or closed an endpoint's circuit."""
    return _of(CircuitChanged, node_id=node_id, instance_id=instance_id)


def streams(node_id: str | None, instance_id: int | None = None) -> str:
    """Where a coordinator says what streams on an endpoint went through."""
    return _of(StreamsDisrupted, node_id=node_id, instance_id=instance_id)


def command(node_id: str, verb: str) -> str:
    """`motor.cmd.<node_id>.<verb>`, as the controller publishes a `verb` command."""
    return _of(VERBS[verb], node_id=node_id)
