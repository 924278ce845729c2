"""The coordinator scrapes every engine's /metrics, serves them relabelled, lists SD targets,
and drops an engine's numbers (counting the error) once it stops answering."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import orjson
from nats.js import JetStreamContext

from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.integration.coord_harness import Cluster, start_coordinator, start_engine, wait_routable


async def until(s: aiohttp.ClientSession, url: str, pred, within: float = 30.0) -> str:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + within
    text = ""
    while time.monotonic() < deadline:
        async with s.get(url) as r:
            text = await r.text()
        if r.status == 200 and pred(text):
            return text
        await asyncio.sleep(0.1)
    raise AssertionError(f"{url} never matched; last:\n{text[-2000:]}")


async def test_engine_metrics_relabelled_and_sd_targets(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    union = await start_engine(tmp_path, "union", "--fast")
    prefill = await start_engine(tmp_path, "prefill", "--fast")
    coord = await start_coordinator(tmp_path, nats_server.url, engine_metrics_interval=0.3)
    try:
        cluster = Cluster(Publisher(js))
        u_id = await cluster.add(union)
        p_id = await cluster.add(prefill, capabilities=["handoff"])
        await wait_routable(coord)
        async with aiohttp.ClientSession() as s:
            want_u = f'vllm:num_requests_running{{instance_id="{u_id}",role="union",node="n{union.port}"'
            want_p = f'vllm:num_requests_running{{instance_id="{p_id}",role="prefill",node="n{prefill.port}"'
            text = await until(s, f"{coord.url}/metrics/engines", lambda t: want_u in t and want_p in t)
            assert text.count("# TYPE vllm:num_requests_running gauge") == 1
            assert f'endpoint="n{union.port}/0"' in text

            async with s.get(f"{coord.url}/prometheus/targets") as r:
                targets = orjson.loads(await r.read())
            by_port = {t["targets"][0]: t["labels"] for t in targets}
            assert by_port[f"127.0.0.1:{union.port}"]["role"] == "union"
            assert by_port[f"127.0.0.1:{prefill.port}"]["instance_id"] == str(p_id)
            assert by_port[f"127.0.0.1:{prefill.port}"]["__metrics_path__"] == "/metrics"

            prefill.stop()  # a silent engine's numbers go; the failed scrape is counted
            await until(s, f"{coord.url}/metrics/engines", lambda t: want_p not in t and want_u in t)
            failed = f'motor_coordinator_engine_scrapes_total{{endpoint="n{prefill.port}/0",result="error"}}'
            await until(s, f"{coord.url}/metrics", lambda t: failed in t)
    finally:
        coord.stop()
        union.stop()
        prefill.stop()
