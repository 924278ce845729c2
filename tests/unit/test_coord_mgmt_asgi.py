"""The management app driven as a bare ASGI app, the way the proxy's in-process bridge calls it."""

from __future__ import annotations

from typing import Any

import orjson

from coordinator.context import CoordinatorContext
from coordinator.mgmt import create_mgmt_app


async def call(app: Any, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    """One request through the ASGI interface: the whole body in one message, as the bridge sends it."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(chunks)


async def test_unexpected_errors_are_answered_not_raised() -> None:
    app = create_mgmt_app(CoordinatorContext())

    async def boom() -> None:
        raise RuntimeError("kaput")

    app.add_api_route("/boom", boom)
    status, body = await call(app, "GET", "/boom")  # must not raise into the bridge
    assert status == 500
    assert orjson.loads(body) == {
        "error": {"message": "internal error: RuntimeError", "type": "server_error", "code": None}
    }


async def test_single_message_bodies_are_read() -> None:
    app = create_mgmt_app(CoordinatorContext())  # no publisher: a valid body ends in 503
    status, body = await call(app, "POST", "/precision/alarm_cleared", orjson.dumps({"d_instance_id": 1}))
    assert status == 503 and orjson.loads(body)["error"]["code"] == "no_event_log"
    status, body = await call(app, "POST", "/precision/alarm_cleared", b"{")
    assert status == 400 and orjson.loads(body)["error"]["code"] == "invalid_json"
    status, body = await call(app, "GET", "/liveness")
    assert status == 200 and orjson.loads(body)["status"] == "ok"
