"""Exceptions of the node agent: one base; start-up problems and command refusals."""

from __future__ import annotations


class NodeAgentError(Exception):
    """Base of every error raised by `nodeagent`."""


class StartupError(NodeAgentError):
    """The agent cannot start with this config or these flags; the message names the field."""


class CommandRefusal(NodeAgentError):
    """A start/stop command that cannot take effect; becomes a `command.refused` event."""

    def __init__(self, code: str, reason: str) -> None:
        super().__init__(f"{code}: {reason}")
        self.code = code
        self.reason = reason
