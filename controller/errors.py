"""The controller's one exception base; its HTTP API maps it to an OpenAI-shaped error body."""

from __future__ import annotations


class ControllerError(Exception):
    """An error of the controller's own; `status` and `code` are how its HTTP API answers it."""

    status = 500
    code = "internal_error"

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        if code is not None:
            self.code = code


class NotServing(ControllerError):
    """The controller is not alive or not ready (a probe's 503): replaying, standby, stopped."""

    status = 503
