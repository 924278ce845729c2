"""The error bodies every HTTP surface answers with, and the one table of their types.

Three dialects of one vocabulary, all chosen by the HTTP status through `STATUS_TYPES`:

- OpenAI: `{"error": {"message", "type", "code"}}` (the coordinator's /v1 and management,
  the controller's API); `code` is a short machine-readable reason of ours, or null.
- Anthropic: `{"type": "error", "error": {"type", "message"}}` (the coordinator's /v1/messages).
- Engine: `{"error": {"message", "type", "param", "code"}}` with vLLM's exception names as the
  type and the status as the code, as the builtin engine answers like vLLM does.

Each has its SSE variant for an error that ends a stream already under way. Pure: bytes out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class ErrorTypes:
    """The `type` of an error body for one HTTP status, per dialect."""

    openai: str
    anthropic: str
    engine: str


# https://platform.openai.com/docs/guides/error-codes, https://docs.anthropic.com/en/api/errors
# and vLLM's exception names (what `openai` clients see as the type of an engine's error).
STATUS_TYPES: dict[int, ErrorTypes] = {
    400: ErrorTypes("invalid_request_error", "invalid_request_error", "BadRequestError"),
    401: ErrorTypes("authentication_error", "authentication_error", "AuthenticationError"),
    403: ErrorTypes("permission_error", "permission_error", "PermissionDeniedError"),
    404: ErrorTypes("not_found_error", "not_found_error", "NotFoundError"),
    405: ErrorTypes("invalid_request_error", "invalid_request_error", "MethodNotAllowed"),
    408: ErrorTypes("timeout_error", "invalid_request_error", "RequestTimeout"),
    409: ErrorTypes("conflict_error", "invalid_request_error", "ConflictError"),
    410: ErrorTypes("invalid_request_error", "invalid_request_error", "GoneError"),
    413: ErrorTypes("invalid_request_error", "request_too_large", "PayloadTooLarge"),
    414: ErrorTypes("invalid_request_error", "invalid_request_error", "URITooLong"),
    415: ErrorTypes("invalid_request_error", "invalid_request_error", "BadRequestError"),
    422: ErrorTypes("invalid_request_error", "invalid_request_error", "BadRequestError"),
    429: ErrorTypes("rate_limit_error", "rate_limit_error", "TooManyRequests"),
    431: ErrorTypes("invalid_request_error", "invalid_request_error", "RequestHeaderFieldsTooLarge"),
    500: ErrorTypes("server_error", "api_error", "InternalServerError"),
    501: ErrorTypes("server_error", "api_error", "NotImplementedError"),
    502: ErrorTypes("upstream_error", "api_error", "BadGateway"),
    503: ErrorTypes("service_unavailable", "overloaded_error", "ServiceUnavailable"),
    504: ErrorTypes("timeout_error", "api_error", "GatewayTimeout"),
    529: ErrorTypes("server_error", "overloaded_error", "InternalServerError"),
}
_CLIENT = ErrorTypes("invalid_request_error", "invalid_request_error", "BadRequestError")
_SERVER = ErrorTypes("server_error", "api_error", "InternalServerError")


def error_types(status: int) -> ErrorTypes:
    """The error types for an HTTP status (a client's or the server's fault when not listed)."""
    found = STATUS_TYPES.get(status)
    if found is not None:
        return found
    return _SERVER if status >= 500 else _CLIENT


def openai_error(status: int, message: str, code: str | None = None, *, type_: str | None = None) -> bytes:
    """`{"error": {"message", "type", "code"}}` as JSON bytes."""
    return orjson.dumps(
        {"error": {"message": message, "type": type_ or error_types(status).openai, "code": code}}
    )


def anthropic_error(status: int, message: str, *, type_: str | None = None) -> bytes:
    """`{"type": "error", "error": {"type", "message"}}` as JSON bytes."""
    kind = type_ or error_types(status).anthropic
    return orjson.dumps({"type": "error", "error": {"type": kind, "message": message}})


def engine_error(status: int, message: str, *, type_: str | None = None, param: str | None = None) -> bytes:
    """`{"error": {"message", "type", "param", "code": status}}`, as vLLM answers."""
    kind = type_ or error_types(status).engine
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}})


def openai_sse_error(status: int, message: str, code: str | None = None) -> bytes:
    """The SSE event that ends an OpenAI stream with an error (`data: {"error": …}`)."""
    return b"data: " + openai_error(status, message, code) + b"\n\n"


def anthropic_sse_error(status: int, message: str, *, type_: str | None = None) -> bytes:
    """The SSE `error` event that ends an Anthropic message stream."""
    return b"event: error\ndata: " + anthropic_error(status, message, type_=type_) + b"\n\n"


def message_of(body: bytes) -> str:
    """What an error body says, whatever its dialect (its text when it is not JSON)."""
    try:
        obj: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip()[:1000] or "(empty body)"
    if isinstance(obj, dict):
        inner = obj.get("error")
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            return str(inner["message"])
        if isinstance(inner, str):
            return inner
        for key in ("message", "detail"):
            if isinstance(obj.get(key), str):
                return str(obj[key])
    return orjson.dumps(obj).decode()[:1000]


def anthropic_from(status: int, body: bytes) -> bytes:
    """An error body of another dialect (an engine's, passed on) in Anthropic's shape."""
    return anthropic_error(status, message_of(body))
