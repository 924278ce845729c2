"""The coordinator's exception base, and which dialect a client path's errors speak."""

from __future__ import annotations

import orjson
import pytest

from coordinator.errors import CoordinatorError, error_for_path


def test_coordinator_error_carries_status_type_code() -> None:
    err = CoordinatorError(404, "model 'x' not found", code="model_not_found")
    assert (err.status, err.type, err.code, str(err)) == (
        404,
        "not_found_error",
        "model_not_found",
        "model 'x' not found",
    )
    assert orjson.loads(err.body()) == {
        "error": {"message": "model 'x' not found", "type": "not_found_error", "code": "model_not_found"}
    }
    assert CoordinatorError(400, "m", type_="custom").type == "custom"


@pytest.mark.parametrize(
    ("path", "anthropic"),
    [
        (b"/v1/messages", True),
        (b"/v1/messages/count_tokens", True),
        (b"/v1/chat/completions", False),
        (b"/v1/messages/other", False),
        (b"/generate", False),
        (b"", False),
    ],
)
def test_errors_speak_the_dialect_of_the_path(path: bytes, anthropic: bool) -> None:
    body = orjson.loads(error_for_path(path, 413, "too big", "body_too_large"))
    if anthropic:
        assert body == {"type": "error", "error": {"type": "request_too_large", "message": "too big"}}
    else:
        assert body == {
            "error": {"message": "too big", "type": "invalid_request_error", "code": "body_too_large"}
        }
