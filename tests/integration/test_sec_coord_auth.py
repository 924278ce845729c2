"""Coordinator auth (issue 12, item 1): user keys guard /v1, admin keys guard management, on
the decoded and normalised path, on one port or on `mgmt_port`; probes stay open.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
import pytest_asyncio
from nats.aio.client import Client
from nats.js import JetStreamContext

from streams.definitions import MOTOR_STREAM
from streams.publisher import Publisher
from streams.reader import read_range
from streams.server import EmbeddedNats
from tests.integration.coord_harness import (
    MODEL,
    Cluster,
    Coordinator,
    Engine,
    free_port,
    start_coordinator,
    start_engine,
    wait_routable,
)
from tests.integration.rawhttp import Reply, exchange, request
from tests.unit.coord_events import seed_instance

USER, ADMIN = "user-key-1", "admin-key-1"
AS_USER = {"authorization": f"Bearer {USER}"}
AS_ADMIN = {"authorization": f"Bearer {ADMIN}"}
REFRESH = orjson.dumps({"event": "add", "ids": [7], "instances": [seed_instance(7, 85, 2, port="1031")]})
ALARM = orjson.dumps({"d_instance_id": 1})
CHAT = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
MESSAGES = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})

# Every way the old check (on the raw path, only under /v1/) was walked around, and the
# normalisations a check on the raw path would miss.
MGMT_WRITES = [
    ("/instances/refresh", REFRESH),
    ("/v1%2Finstances/refresh", REFRESH),
    ("/v1%2finstances%2frefresh", REFRESH),
    ("/precision/alarm_cleared", ALARM),
    ("/v1/instances/refresh", REFRESH),
    ("//v1/instances/refresh", REFRESH),
    ("/v1/./instances/refresh", REFRESH),
    ("/v1/x/../instances/refresh", REFRESH),
    ("/%2E/instances/refresh", REFRESH),
]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Engine]:
    eng = await start_engine(tmp_path_factory.mktemp("eng"), "union", "--fast")
    yield eng
    eng.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def coord(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, engine: Engine
) -> AsyncIterator[Coordinator]:
    c = await start_coordinator(tmp_path, nats_server.url, api_keys=[USER], admin_keys=[ADMIN])
    try:
        await Cluster(Publisher(js)).add(engine)
        await wait_routable(c, headers=AS_USER)
        yield c
    finally:
        c.stop()


async def _writes(nc: Client) -> int:
    """Management writes in the log so far."""
    kinds = ("instances.refreshed", "precision.alarm_cleared")
    return sum([1 async for r in read_range(nc, MOTOR_STREAM) if r.event.type in kinds])


def _openai_401(reply: Reply) -> None:
    assert reply.status == 401, reply
    err = reply.json()["error"]  # type: ignore[index]
    assert err["type"] == "authentication_error" and err["message"]
    assert reply.headers.get("www-authenticate", "").lower().startswith("bearer")


@pytest.mark.parametrize(("path", "body"), MGMT_WRITES)
async def test_management_writes_need_an_admin_key(
    coord: Coordinator, nc: Client, path: str, body: bytes
) -> None:
    before = await _writes(nc)
    _openai_401(await exchange(coord.port, request("POST", path, body)))
    # A user key is a key, but not one for management.
    r = await exchange(coord.port, request("POST", path, body, AS_USER))
    assert r.status == 403, r
    assert r.json()["error"]["type"] == "permission_error"  # type: ignore[index]
    assert "admin" in r.json()["error"]["message"]  # type: ignore[index]
    assert await _writes(nc) == before, "an unauthorised write reached the log"


async def test_an_admin_key_writes_through_every_alias(coord: Coordinator) -> None:
    for path, headers in [
        ("/v1/instances/refresh", AS_ADMIN),
        ("/instances/refresh", {"x-api-key": ADMIN}),
        ("/v1%2Finstances/refresh", {"Authorization": f"bearer {ADMIN}"}),
        ("/v1/instances/refresh", {"AUTHORIZATION": f"BEARER   {ADMIN}"}),
    ]:
        r = await exchange(coord.port, request("POST", path, REFRESH, headers))
        assert r.status == 200, (path, r)
    r = await exchange(coord.port, request("GET", "/v1/instances", headers=AS_ADMIN))
    assert r.status == 200 and "ext/7" in r.body.decode()
    # An admin key opens the user routes too.
    assert (await exchange(coord.port, request("POST", "/v1/chat/completions", CHAT, AS_ADMIN))).status == 200


async def test_views_and_unknown_paths_need_a_key(coord: Coordinator) -> None:
    for path in ("/v1/instances", "/", "/nothing/here", "/v1/nothing", "/metrics/../v1/instances"):
        _openai_401(await exchange(coord.port, request("GET", path)))
        assert (await exchange(coord.port, request("GET", path, headers=AS_USER))).status == 403


async def test_probes_and_metrics_stay_open(coord: Coordinator) -> None:
    for path in ("/liveness", "/readiness", "/startup", "/health", "/metrics"):
        r = await exchange(coord.port, request("GET", path))
        assert r.status == 200, (path, r)


async def test_user_routes_take_user_keys_either_header_any_case(coord: Coordinator) -> None:
    _openai_401(await exchange(coord.port, request("POST", "/v1/chat/completions", CHAT)))
    _openai_401(await exchange(coord.port, request("GET", "/v1/models")))
    wrong = {"authorization": f"Bearer {USER}x"}
    _openai_401(await exchange(coord.port, request("POST", "/v1/chat/completions", CHAT, wrong)))
    for headers in (AS_USER, {"Authorization": f"bearer {USER}"}, {"x-api-key": USER}):
        r = await exchange(coord.port, request("POST", "/v1/chat/completions", CHAT, headers))
        assert r.status == 200, (headers, r)
    # The normalised path routes and is checked the same way.
    _openai_401(await exchange(coord.port, request("POST", "/v1//chat/completions", CHAT)))
    r = await exchange(coord.port, request("POST", "/v1%2Fchat/completions", CHAT, AS_USER))
    assert r.status == 200, r


async def test_native_routes_need_a_user_key(coord: Coordinator) -> None:
    tokenize = orjson.dumps({"model": MODEL, "prompt": "hi"})
    for method, path in [
        ("POST", "/generate"),
        ("POST", "/v1/score"),
        ("POST", "/v1%2Frerank"),
        ("POST", "/tokenize"),
        ("GET", f"/v1/models/{MODEL}"),
    ]:
        _openai_401(await exchange(coord.port, request(method, path, tokenize if method == "POST" else b"")))
    assert (await exchange(coord.port, request("GET", f"/v1/models/{MODEL}", headers=AS_USER))).status == 200
    assert (await exchange(coord.port, request("POST", "/tokenize", tokenize, AS_USER))).status == 200


async def test_messages_401_is_anthropic_shaped(coord: Coordinator) -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        r = await exchange(coord.port, request("POST", path, MESSAGES))
        assert r.status == 401
        body = r.json()
        assert isinstance(body, dict) and body["type"] == "error"
        assert body["error"]["type"] == "authentication_error" and body["error"]["message"]
    r = await exchange(coord.port, request("POST", "/v1/messages", MESSAGES, {"x-api-key": USER}))
    assert r.status == 200 and r.json()["type"] == "message"  # type: ignore[index]


async def test_metrics_can_require_an_admin_key(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    c = await start_coordinator(
        tmp_path, nats_server.url, api_keys=[USER], admin_keys=[ADMIN], public_metrics=False
    )
    try:
        _openai_401(await exchange(c.port, request("GET", "/metrics")))
        assert (await exchange(c.port, request("GET", "/metrics", headers=AS_USER))).status == 403
        assert (await exchange(c.port, request("GET", "/metrics", headers=AS_ADMIN))).status == 200
        assert (await exchange(c.port, request("GET", "/liveness"))).status == 200
    finally:
        c.stop()


async def test_user_keys_alone_lock_management(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    c = await start_coordinator(tmp_path, nats_server.url, api_keys=[USER])
    try:
        r = await exchange(c.port, request("POST", "/instances/refresh", REFRESH, AS_USER))
        assert r.status == 403 and "coordinator.admin_keys" in r.body.decode()
        assert "admin_keys is empty" in c.log_text()
    finally:
        c.stop()


async def test_admin_keys_alone_leave_v1_open(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, engine: Engine
) -> None:
    c = await start_coordinator(tmp_path, nats_server.url, admin_keys=[ADMIN])
    try:
        await Cluster(Publisher(js)).add(engine)
        await wait_routable(c)
        _openai_401(await exchange(c.port, request("POST", "/instances/refresh", REFRESH)))
        assert (
            await exchange(c.port, request("POST", "/instances/refresh", REFRESH, AS_ADMIN))
        ).status == 200
    finally:
        c.stop()


async def test_mgmt_port_serves_management_apart(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext, engine: Engine
) -> None:
    mport = free_port()
    c = await start_coordinator(
        tmp_path, nats_server.url, api_keys=[USER], admin_keys=[ADMIN], mgmt_port=mport
    )
    try:
        await Cluster(Publisher(js)).add(engine)
        await wait_routable(c, headers=AS_USER)
        # Management lives on its own port, behind admin keys, whatever the path spelling.
        for path, _ in MGMT_WRITES[:4]:
            _openai_401(await exchange(mport, request("POST", path, REFRESH)))
            assert (await exchange(mport, request("POST", path, REFRESH, AS_USER))).status == 403
        r = await exchange(mport, request("POST", "/v1/instances/refresh", REFRESH, AS_ADMIN))
        assert r.status == 200, r
        assert (await exchange(mport, request("GET", "/liveness"))).status == 200
        # The /v1 port no longer serves it, with any key; its probes stay.
        for path, _ in MGMT_WRITES[:4]:
            r = await exchange(c.port, request("POST", path, REFRESH, AS_ADMIN))
            assert r.status == 404, (path, r)
        assert (await exchange(c.port, request("GET", "/v1/instances", headers=AS_ADMIN))).status == 404
        assert (await exchange(c.port, request("GET", "/readiness"))).status == 200
        r = await exchange(c.port, request("POST", "/v1/chat/completions", CHAT, AS_USER))
        assert r.status == 200
        # ... and the management port does not proxy generation.
        r = await exchange(mport, request("POST", "/v1/chat/completions", CHAT, AS_ADMIN))
        assert r.status == 404
    finally:
        c.stop()
