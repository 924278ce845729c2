"""Every coordinator error leaves OpenAI-shaped."""

from __future__ import annotations

import orjson
import pytest

from coordinator.errors import CoordinatorError, error_body


@pytest.mark.parametrize(
    ("status", "type_"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (404, "not_found_error"),
        (413, "invalid_request_error"),
        (429, "rate_limit_error"),
        (503, "service_unavailable"),
        (599, "server_error"),
    ],
)
def test_error_body_shape_and_default_type(status: int, type_: str) -> None:
    body = orjson.loads(error_body(status, "boom"))
    assert body == {"error": {"message": "boom", "type": type_, "code": None}}


def test_coordinator_error_carries_status_type_code() -> None:
    err = CoordinatorError(404, "model 'x' not found", code="model_not_found")
    assert (err.status, err.type, err.code, str(err)) == (
        404,
        "not_found_error",
        "model_not_found",
        "model 'x' not found",
    )
    assert orjson.loads(err.body())["error"]["code"] == "model_not_found"
    assert CoordinatorError(400, "m", type_="custom").type == "custom"
