"""One error vocabulary (core.http_errors): every dialect's body, its SSE variant, and the one
status → type table every HTTP surface answers with."""

from __future__ import annotations

import orjson
import pytest

from core.http_errors import (
    STATUS_TYPES,
    anthropic_error,
    anthropic_from,
    anthropic_sse_error,
    engine_error,
    error_types,
    message_of,
    openai_error,
    openai_sse_error,
)


@pytest.mark.parametrize(
    ("status", "openai", "anthropic", "engine"),
    [
        (400, "invalid_request_error", "invalid_request_error", "BadRequestError"),
        (401, "authentication_error", "authentication_error", "AuthenticationError"),
        (403, "permission_error", "permission_error", "PermissionDeniedError"),
        # The controller once said invalid_request_error here, the coordinator not_found_error.
        (404, "not_found_error", "not_found_error", "NotFoundError"),
        (405, "invalid_request_error", "invalid_request_error", "MethodNotAllowed"),
        (408, "timeout_error", "invalid_request_error", "RequestTimeout"),
        (409, "conflict_error", "invalid_request_error", "ConflictError"),
        (410, "invalid_request_error", "invalid_request_error", "GoneError"),
        (413, "invalid_request_error", "request_too_large", "PayloadTooLarge"),
        (418, "invalid_request_error", "invalid_request_error", "BadRequestError"),  # not listed
        (429, "rate_limit_error", "rate_limit_error", "TooManyRequests"),
        (431, "invalid_request_error", "invalid_request_error", "RequestHeaderFieldsTooLarge"),
        (500, "server_error", "api_error", "InternalServerError"),
        (502, "upstream_error", "api_error", "BadGateway"),
        (503, "service_unavailable", "overloaded_error", "ServiceUnavailable"),
        (504, "timeout_error", "api_error", "GatewayTimeout"),
        (529, "server_error", "overloaded_error", "InternalServerError"),
        (599, "server_error", "api_error", "InternalServerError"),  # not listed
    ],
)
def test_one_table_gives_every_dialects_type(status: int, openai: str, anthropic: str, engine: str) -> None:
    t = error_types(status)
    assert (t.openai, t.anthropic, t.engine) == (openai, anthropic, engine)
    assert orjson.loads(openai_error(status, "boom")) == {
        "error": {"message": "boom", "type": openai, "code": None}
    }
    assert orjson.loads(anthropic_error(status, "boom")) == {
        "type": "error",
        "error": {"type": anthropic, "message": "boom"},
    }
    assert orjson.loads(engine_error(status, "boom", param="p")) == {
        "error": {"message": "boom", "type": engine, "param": "p", "code": status}
    }


def test_every_listed_status_is_an_error_status() -> None:
    assert all(400 <= s < 600 for s in STATUS_TYPES)


def test_a_named_type_and_code_win_over_the_table() -> None:
    assert orjson.loads(openai_error(400, "m", "invalid_json", type_="custom")) == {
        "error": {"message": "m", "type": "custom", "code": "invalid_json"}
    }
    assert orjson.loads(anthropic_error(400, "m", type_="custom"))["error"]["type"] == "custom"
    assert orjson.loads(engine_error(502, "m", type_="KVTransferError"))["error"]["type"] == "KVTransferError"


def test_sse_variants_end_a_stream_in_each_api() -> None:
    assert openai_sse_error(502, 'a "quoted" reason') == (
        b'data: {"error":{"message":"a \\"quoted\\" reason","type":"upstream_error","code":null}}\n\n'
    )
    event = anthropic_sse_error(502, "gone")
    name, data = event.split(b"\n", 1)
    assert name == b"event: error" and data.endswith(b"\n\n")
    assert orjson.loads(data.removeprefix(b"data: ")) == {
        "type": "error",
        "error": {"type": "api_error", "message": "gone"},
    }


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error":{"message":"bad temperature","type":"BadRequestError","param":null,"code":400}}', "bad temperature"),
        (b'{"object":"error","message":"old vLLM shape","type":"BadRequestError"}', "old vLLM shape"),
        (b'{"error":"a plain string"}', "a plain string"),
        (b'{"detail":"Not Found"}', "Not Found"),
        (b"upstream connect error", "upstream connect error"),
        (b"", "(empty body)"),
        (b"[1,2]", "[1,2]"),
    ],
)  # fmt: skip
def test_message_of_any_dialect(body: bytes, message: str) -> None:
    assert message_of(body) == message


def test_an_engine_error_passed_to_an_anthropic_client_is_anthropic_shaped() -> None:
    engine = engine_error(400, "max_tokens is too large", param="max_tokens")
    assert orjson.loads(anthropic_from(400, engine)) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "max_tokens is too large"},
    }
