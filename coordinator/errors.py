"""The coordinator's one exception base and the one helper that shapes every error body.

Every error a client sees is OpenAI-shaped: `{"error": {"message", "type", "code"}}`. The
HTTP mapping happens here, at the edge; inner code raises `CoordinatorError` with a status.
"""

from __future__ import annotations

import orjson

# OpenAI's error `type` for a status when the raiser names none.
_DEFAULT_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def default_type(status: int) -> str:
    """OpenAI's error type for an HTTP status."""
    found = _DEFAULT_TYPE.get(status)
    if found is not None:
        return found
    return "server_error" if status >= 500 else "invalid_request_error"


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
        self.type = type_ or default_type(status)
        self.code = code
        self.headers = headers or {}

    def body(self) -> bytes:
        """The JSON body of this error."""
        return error_body(self.status, self.message, self.type, self.code)


def error_body(status: int, message: str, type_: str | None = None, code: str | None = None) -> bytes:
    """An OpenAI-shaped error body `{"error": {"message", "type", "code"}}` as JSON bytes."""
    return orjson.dumps({"error": {"message": message, "type": type_ or default_type(status), "code": code}})


# Anthropic's error `type` for a status (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_body(status: int, message: str) -> bytes:
    """An Anthropic-shaped error body `{"type": "error", "error": {"type", "message"}}`."""
    kind = _ANTHROPIC_TYPE.get(status) or ("api_error" if status >= 500 else "invalid_request_error")
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})
