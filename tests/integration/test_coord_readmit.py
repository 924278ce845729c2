"""A request outlives an engine's restart: the endpoint that failed it earlier is a candidate
again once it is READY as a new process (real builtin engines, a real coordinator)."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import aiohttp
from nats.js import JetStreamContext

from core.events import EndpointStatus
from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.integration.coord_harness import (
    MODEL,
    Cluster,
    post,
    start_coordinator,
    start_engine,
    wait_routable,
)
from tests.integration.test_coord_fleet_faults import BUSY, HANDOFF, wait_log


async def test_a_request_whose_other_paths_fail_goes_back_to_its_restarted_engine(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    """Regression (`just bench chaos`, 3-7 of ~500 requests answered 502 `every attempt
    failed`): a request's first attempt failed on the union engine just killed, its next on
    a prefill killed moments later; by then the union was back READY as a new process, but
    the request still excluded it, and no path was left."""
    union = await start_engine(tmp_path, "union", "--fast")
    prefill = await start_engine(tmp_path, "prefill", "--fast")
    decode = await start_engine(tmp_path, "decode", "--fast")
    engines = [union, prefill, decode]
    # The prefill leg waits on the frozen prefill until the test kills it, whatever the time.
    c = await start_coordinator(tmp_path, nats_server.url, first_token_timeout=120, retries=3)
    try:
        cluster = Cluster(Publisher(js))
        u_id = await cluster.add(union, **HANDOFF)
        await cluster.add(prefill, **HANDOFF)
        d_id = await cluster.add(decode, **HANDOFF)
        await cluster.load(decode, d_id, BUSY)  # the union wins the first attempt
        await wait_routable(c)
        os.kill(union.proc.pid, signal.SIGKILL)  # gone, its READY still in the table
        union.proc.wait()
        os.kill(prefill.proc.pid, signal.SIGSTOP)  # the pair's attempt hangs on its prefill
        async with aiohttp.ClientSession() as s:
            body = {"model": MODEL, "prompt": "outlive", "max_tokens": 4, "temperature": 0}
            ask = asyncio.create_task(post(s, f"{c.url}/v1/completions", body))
            await wait_log(c, f"retrying elsewhere: n{union.port}/0")  # first attempt failed there
            # The node agent's part: the union dies and comes back as a new process.
            await cluster.status(union, u_id, EndpointStatus.DEAD, EndpointStatus.READY)
            reborn = await start_engine(tmp_path, "union", "--fast", port=union.port)
            engines.append(reborn)
            await cluster.status(reborn, u_id, EndpointStatus.STARTING, EndpointStatus.DEAD)
            await cluster.status(reborn, u_id, EndpointStatus.READY, EndpointStatus.STARTING)
            await wait_log(c, f"endpoint n{union.port}/0 is a new process (pid {reborn.proc.pid}")
            assert not ask.done(), "the request ended before its prefill failed"
            os.kill(prefill.proc.pid, signal.SIGKILL)  # the pair's attempt fails now
            status, data, _ = await asyncio.wait_for(ask, 60)
        assert status == 200, data
        assert data["choices"][0]["text"]
        assert f"n{union.port}/0 is a new process since it failed this request" in c.log_text()
    finally:
        c.stop()
        for e in engines:
            if e.alive():
                os.kill(e.proc.pid, signal.SIGCONT)
            e.stop()
