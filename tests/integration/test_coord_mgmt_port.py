"""With `coordinator.mgmt_port`, the management API answers on its own port (seed 001's
manage_port): probes, metrics and the instance refresh, not the /v1 generation routes."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from nats.js import JetStreamContext

from streams.server import EmbeddedNats
from tests.integration.coord_harness import free_port, post, start_coordinator
from tests.unit.coord_events import seed_instance


async def test_management_api_on_the_manage_port(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    mgmt = free_port()
    coord = await start_coordinator(tmp_path, nats_server.url, mgmt_port=mgmt)
    base = f"http://127.0.0.1:{mgmt}"
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{base}/liveness") as r:
                assert r.status == 200
            body = {"ids": [0], "instances": [seed_instance(0, 85, 2, port="1025")]}
            st, _, _ = await post(s, f"{base}/v1/instances/refresh", body)
            assert st == 200
            async with s.get(f"{base}/v1/instances") as r:
                assert r.status == 200 and "ext/0" in await r.text()
            bad = {"ids": [1], "instances": [seed_instance(1, 85, 5, port="1025")]}
            st, err, _ = await post(s, f"{base}/v1/instances/refresh", bad)
            assert st == 400 and "static_info.label" in err["error"]["message"]
            st, _, _ = await post(s, f"{base}/v1/chat/completions", {"messages": []})
            assert st == 404  # generation stays on the client port
    finally:
        coord.stop()
