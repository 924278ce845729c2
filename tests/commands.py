"""Where a command to a node travels, for a test that publishes something else there (a
malformed command, a stray): the subject its event class's placement gives (`core.subjects`
formats it)."""

from __future__ import annotations

from types import SimpleNamespace

from core.events import EventBase, StartCommand, StopCommand

VERBS: dict[str, type[EventBase]] = {"start": StartCommand, "stop": StopCommand}


def command_subject(node_id: str, verb: str) -> str:
    """`motor.cmd.<node_id>.<verb>`, as the controller publishes a `verb` command."""
    return VERBS[verb].SUBJECT.subject(SimpleNamespace(node_id=node_id))
