"""Exceptions of the core package: one base, specific subclasses."""

from __future__ import annotations


class CoreError(Exception):
    """Base of every error raised by `core`."""


class SubjectError(CoreError, ValueError):
    """A subject or subject token that does not follow the layout."""


class DecodeError(CoreError, ValueError):
    """Bytes that are not a valid event."""


class UnknownEventType(DecodeError):
    """An event whose type this code does not know (a newer producer)."""

    def __init__(self, event_type: str) -> None:
        super().__init__(f"unknown event type {event_type!r}")
        self.event_type = event_type


class NewerSchema(DecodeError):
    """An event with a schema_version newer than this code understands."""

    def __init__(self, event_type: str, version: int, supported: int) -> None:
        super().__init__(
            f"event type {event_type!r} has schema_version {version}, this code knows up to {supported}"
        )
        self.event_type = event_type
        self.version = version


class WrongSubject(DecodeError):
    """An event on a subject other than the one its data names (e.g. node a's registration on
    node b's subject): NATS permissions are per subject, so such an event is not believed."""

    def __init__(self, event_type: str, subject: str, expected: str) -> None:
        super().__init__(f"{event_type!r} on {subject!r}, but its data says {expected!r}")
        self.event_type = event_type
        self.subject = subject
        self.expected = expected


class ConfigError(CoreError, ValueError):
    """A cluster config that does not validate; the message names file and field."""
