"""Exceptions of the node agent: one base; start-up problems and command refusals."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class NodeAgentError(Exception):
    """Base of every error raised by `nodeagent`."""


class StartupError(NodeAgentError):
    """The agent cannot start with this config or these flags; the message names the field."""


class Refusal(BaseModel):
    """Why a command did not take effect: its `command.refused` code and reason, as remembered."""

    model_config = ConfigDict(frozen=True)

    code: str  # job_mismatch | bad_endpoint | port_in_use | stale_term | handler_failed | ...
    reason: str
    seen_term: int | None = None  # stale_term: the newest leader term this node obeyed


class CommandRefusal(NodeAgentError):
    """A start/stop command that cannot take effect; becomes a `command.refused` event."""

    def __init__(self, code: str, reason: str, *, seen_term: int | None = None) -> None:
        super().__init__(f"{code}: {reason}")
        self.refusal = Refusal(code=code, reason=reason, seen_term=seen_term)

    @property
    def code(self) -> str:
        return self.refusal.code

    @property
    def reason(self) -> str:
        return self.refusal.reason
