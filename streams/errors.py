"""Exceptions of the streams package: one base, specific subclasses."""

from __future__ import annotations


class StreamsError(Exception):
    """Base of every error raised by `streams`."""


class NatsServerNotFound(StreamsError):
    """No `nats-server` binary in the venv or on PATH."""


class NatsServerFailed(StreamsError):
    """The embedded nats-server did not start or did not become healthy."""


class NatsUnavailable(StreamsError):
    """No NATS server could be reached at the given URLs."""


class SequenceConflict(StreamsError):
    """The expected last subject sequence did not match: someone else wrote first."""

    def __init__(self, subject: str, expected: int, detail: str = "") -> None:
        super().__init__(
            f"{subject}: expected last subject sequence {expected} did not match {detail}".rstrip()
        )
        self.subject = subject
        self.expected = expected


class PublishTimeout(StreamsError):
    """JetStream did not acknowledge a publish in time."""


class PublishFailed(StreamsError):
    """JetStream refused a publish (no stream for the subject, limits, ...)."""


class StoreFull(PublishFailed):
    """JetStream refused a publish because a store limit is reached (MOTOR's `max_bytes`, the
    server's store): not the event's fault, and nothing was stored; publishers keep it and try
    again, as while NATS is away. The message says which limit and what the operator can do."""


class CheckpointError(StreamsError):
    """A checkpoint could not be stored or read back."""


class CorruptCheckpoint(CheckpointError):
    """The stored checkpoint is not one this version can read (a bad value, another format):
    nothing to retry, the log is replayed instead."""
