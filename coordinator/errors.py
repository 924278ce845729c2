"""The coordinator's one exception base, and which error dialect a client path speaks.

Bodies come from `core.http_errors`: Anthropic-shaped on the Anthropic routes, OpenAI-shaped
everywhere else. The HTTP mapping happens at the edge; inner code raises `CoordinatorError`
with a status.
"""

from __future__ import annotations

from core.http_errors import anthropic_error, error_types, openai_error

# Client paths whose errors are Anthropic-shaped.
ANTHROPIC_PATHS = frozenset({b"/v1/messages", b"/v1/messages/count_tokens"})


class CoordinatorError(Exception):
    """An error that leaves the coordinator as an HTTP response with an OpenAI body."""

    def __init__(
        self,
        status: int,
        message: str,
        type_: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_ or error_types(status).openai
        self.code = code
        self.headers = headers or {}

    def body(self) -> bytes:
        """The JSON body of this error."""
        return openai_error(self.status, self.message, self.code, type_=self.type)


def error_for_path(path: bytes, status: int, message: str, code: str | None = None) -> bytes:
    """The error body a client of `path` expects: Anthropic's on its routes, else OpenAI's."""
    if path in ANTHROPIC_PATHS:
        return anthropic_error(status, message)
    return openai_error(status, message, code)
