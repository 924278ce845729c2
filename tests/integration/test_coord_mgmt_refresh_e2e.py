"""Engines run outside Motor, registered only through `POST /v1/instances/refresh` (seed 001),
are routed by a real `motor coordinator` process: union and P/D, readiness, alarms, removal.
Everything goes through the coordinator's one port (the proxy hands management to FastAPI).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import pytest_asyncio
from nats.aio.client import Client
from nats.js import JetStreamContext

from core.events import PrecisionAlarmRaised, PrecisionAlarmRaisedData
from core.ids import new_id
from streams.definitions import MOTOR_STREAM
from streams.publisher import Publisher
from streams.reader import read_range
from streams.server import EmbeddedNats
from tests.integration.coord_harness import MODEL, Coordinator, Engine, post, start_coordinator, start_engine
from tests.unit.coord_events import seed_instance

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Name three rivers."}], "max_tokens": 16}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engines(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Engine]]:
    tmp = tmp_path_factory.mktemp("ext-engines")
    started: dict[str, Engine] = {}
    try:
        for role in ("union", "prefill", "decode"):
            started[role] = await start_engine(tmp, role, "--fast")
        yield started
    finally:
        for eng in started.values():
            eng.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def coord(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> AsyncIterator[Coordinator]:
    c = await start_coordinator(tmp_path, nats_server.url)
    try:
        yield c
    finally:
        c.stop()


def external(iid: int, eng: Engine, role_code: int, label: int, **extra: Any) -> dict[str, Any]:
    return seed_instance(iid, role_code, label, port=str(eng.port), model=MODEL, **extra)


async def get(s: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with s.get(url) as r:
        raw = await r.read()
        return r.status, orjson.loads(raw) if raw else None


async def test_a_union_engine_registered_by_refresh_serves_requests(
    coord: Coordinator, engines: dict[str, Engine], nc: Client
) -> None:
    union = engines["union"]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        status, body = await get(s, f"{coord.url}/readiness")
        assert status == 503 and body["error"]["code"] == "not_ready"
        status, body, _ = await post(s, f"{coord.url}/v1/chat/completions", CHAT)
        assert status == 404 and body["error"]["code"] == "model_not_found"  # nothing serves it yet

        refresh = {"ids": [7], "instances": [external(7, union, 85, 2, engine_type="builtin")]}
        async with s.post(f"{coord.url}/v1/instances/refresh", data=orjson.dumps(refresh)) as r:
            assert (r.status, await r.read()) == (200, b"")
        # Read your writes: the answer came after the coordinator folded the event.
        status, _ = await get(s, f"{coord.url}/readiness")
        assert status == 200
        status, direct, _ = await post(s, f"{union.url}/v1/chat/completions", CHAT)
        assert status == 200
        status, via, _ = await post(s, f"{coord.url}/v1/chat/completions", CHAT)
        assert status == 200
        assert via["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]
        status, models = await get(s, f"{coord.url}/v1/models")
        assert status == 200 and [m["id"] for m in models["data"]] == [MODEL]

        # Removed again (Motor's `del`): known no more, so 404; not ready.
        async with s.post(
            f"{coord.url}/instances/refresh", data=orjson.dumps({"event": "del", "ids": [7], "instances": []})
        ) as r:
            assert r.status == 200
        assert (await get(s, f"{coord.url}/readiness"))[0] == 503
        status, body, _ = await post(s, f"{coord.url}/v1/chat/completions", CHAT)
        assert status == 404
    types = [rec.event.type async for rec in read_range(nc, MOTOR_STREAM)]
    assert types == ["instances.refreshed", "instances.refreshed"]


async def test_external_pd_pair_routes_two_hops_and_obeys_precision_alarms(
    coord: Coordinator, engines: dict[str, Engine], js: JetStreamContext
) -> None:
    p, d, union = engines["prefill"], engines["decode"], engines["union"]
    refresh = {
        "ids": [1, 2],
        "instances": [
            external(1, p, 80, 2, engine_type="builtin", capabilities=["handoff"]),
            external(2, d, 68, 3, engine_type="builtin", capabilities=["handoff"], peers=[1]),
        ],
    }
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        async with s.post(f"{coord.url}/v1/instances/refresh", data=orjson.dumps(refresh)) as r:
            assert r.status == 200, await r.text()
        status, listing = await get(s, f"{coord.url}/v1/instances")
        assert status == 200
        assert listing["plans"][MODEL] == {
            "kind": "pd",
            "role": None,
            "capability": "handoff",
            "engine_type": "builtin",
            "reason": "",
            "paths": ["pd:builtin/handoff", "prefill"],
        }
        status, direct, _ = await post(s, f"{union.url}/v1/chat/completions", CHAT)
        status, via, _ = await post(s, f"{coord.url}/v1/chat/completions", CHAT)
        assert status == 200, via
        assert via["choices"][0]["message"]["content"] == direct["choices"][0]["message"]["content"]

        # A precision alarm on the pair (as the detector or an operator appends it) stops routing …
        alarm = PrecisionAlarmRaised(
            id=new_id(),
            ts=1.0,
            source="operator",
            data=PrecisionAlarmRaisedData(alarm_id="a1", d_instance_id=2, p_instance_id=1, reason="garbage"),
        )
        await Publisher(js).publish(alarm)
        await wait_status(s, f"{coord.url}/readiness", 503)
        status, body, _ = await post(s, f"{coord.url}/v1/chat/completions", CHAT)
        assert status == 503 and "precision alarm" in body["error"]["message"]
        # … until it is cleared through seed 002's API.
        status, cleared, _ = await post(
            s, f"{coord.url}/precision/alarm_cleared", {"d_instance_id": 2, "p_instance_id": 1}
        )
        assert status == 200 and cleared["data"] == {"dismissed": True}
        status, via, _ = await post(s, f"{coord.url}/v1/chat/completions", CHAT)
        assert status == 200

        # A bad body through the same port: 400 naming the field, nothing appended.
        bad = {"ids": [3], "instances": [external(3, p, 68, 3)]}  # a decode without peers
        status, body, _ = await post(s, f"{coord.url}/v1/instances/refresh", bad)
        assert status == 400 and body["error"]["message"].startswith("instances[0].dynamic_info.peers:")
        status, text = await get_text(s, f"{coord.url}/metrics")
        assert 'motor_coordinator_instance_refreshes_total{result="accepted"} 1.0' in text
        assert 'motor_coordinator_instance_refreshes_total{result="rejected"} 1.0' in text


async def get_text(s: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with s.get(url) as r:
        return r.status, await r.text()


async def wait_status(s: aiohttp.ClientSession, url: str, want: int, within: float = 30.0) -> None:
    """Poll until `url` answers `want` (the alarm was appended by another writer: nothing to await)."""
    deadline = time.monotonic() + within
    while True:
        async with s.get(url) as r:
            if r.status == want:
                return
        assert time.monotonic() < deadline, f"{url} never answered {want}"
        await asyncio.sleep(0.05)
