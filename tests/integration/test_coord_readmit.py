"""A request outlives a change of the fleet: each retry weighs the paths there are now — an
endpoint that failed it earlier is a candidate again once READY as a new process, one that
came back while it waited is one too (real builtin engines, a real coordinator)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


async def _until_row(c_url: str, port: int, what: str, pred: Callable[[dict[str, Any]], bool]) -> None:
    """Until the coordinator's `GET /v1/instances` row of the endpoint on `port` fits `pred`."""
    deadline = time.monotonic() + 30
    async with aiohttp.ClientSession() as s:
        while True:
            async with s.get(f"{c_url}/v1/instances") as r:
                rows = (await r.json())["data"]
            if any(row["port"] == port and pred(row) for row in rows):
                return
            assert time.monotonic() < deadline, f"never {what}: {rows}"
            await asyncio.sleep(0.05)


async def test_a_retry_weighs_a_path_that_came_back_while_the_request_waited(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    """Regression (`just bench chaos`, 502 `no healthy path left ... (prefill-0/0 failed for
    this request)` with the union READY and idle): a request began while the union was down,
    and every retry kept the plan made then, which had no union path."""
    union = await start_engine(tmp_path, "union", "--fast")
    prefill = await start_engine(tmp_path, "prefill", "--fast")
    decode = await start_engine(tmp_path, "decode", "--fast")
    engines = [union, prefill, decode]
    c = await start_coordinator(tmp_path, nats_server.url, first_token_timeout=120, retries=3)
    try:
        cluster = Cluster(Publisher(js))
        u_id = await cluster.add(union, **HANDOFF)
        await cluster.add(prefill, **HANDOFF)
        await cluster.add(decode, **HANDOFF)
        await wait_routable(c)
        await cluster.status(union, u_id, EndpointStatus.DEAD, EndpointStatus.READY)  # the union is down
        await _until_row(c.url, union.port, "unroutable", lambda r: not r["routable"])
        os.kill(prefill.proc.pid, signal.SIGSTOP)  # the pair's attempt hangs on its prefill
        async with aiohttp.ClientSession() as s:
            body = {"model": MODEL, "prompt": "outlast", "max_tokens": 4, "temperature": 0}
            ask = asyncio.create_task(post(s, f"{c.url}/v1/completions", body))
            await _until_row(c.url, decode.port, "routed to the pair", lambda r: r["inflight"] > 0)
            await cluster.status(union, u_id, EndpointStatus.READY, EndpointStatus.DEAD)  # back
            await _until_row(c.url, union.port, "routable again", lambda r: r["routable"])
            assert not ask.done(), "the request ended before its prefill failed"
            os.kill(prefill.proc.pid, signal.SIGKILL)  # the pair's attempt fails now
            status, data, _ = await asyncio.wait_for(ask, 60)
        assert status == 200, data
        assert data["choices"][0]["text"]
    finally:
        c.stop()
        for e in engines:
            if e.alive():
                os.kill(e.proc.pid, signal.SIGCONT)
            e.stop()
