"""Real vLLM's KV events (`--kv-events-config`) read by the node agent's own follower.

One engine, launched as the node agent's backend launches it, publishes on ZMQ PUB with a
replay socket. `nodeagent.kvwatch.KvFollower` (what the agent runs) decodes its frames,
derives Motor's chain names from each BlockStored's token ids, and the names equal what the
coordinator computes for the same token ids (`core.kvblocks.prompt_chain`): kv_aware matches
vLLM's cache without vLLM's hash. A second follower started after the fact gets the same
blocks from the replay socket alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path

import pytest
import zmq.asyncio

from core.events import Role
from core.kvblocks import decode_view, prompt_chain
from nodeagent.kvaddr import KvAddrs
from nodeagent.kvwatch import KvFollower
from nodeagent.metrics import AgentMetrics
from tests.integration.nodeagent_harness import free_port
from tests.real.cluster import cluster_config, real_cluster
from tests.real.conftest import Timings
from tests.real.vllm_proc import ENGINE_CONFIG, STARTUP_TIMEOUT, VllmProc, engine_section, get_text, post_json

pytestmark = [pytest.mark.real, pytest.mark.timeout(1800)]

BLOCK = int(ENGINE_CONFIG["block_size"])
PROMPT_IDS = [(i * 37) % 180 + 10 for i in range(3 * BLOCK + 5)]  # three full blocks and a bit (small vocab)


async def _follow(
    addrs: KvAddrs, views: list[bytes]
) -> tuple[KvFollower, asyncio.Task[None], zmq.asyncio.Context]:
    async def put(key: str, value: bytes) -> None:
        views.append(value)

    zctx = zmq.asyncio.Context()
    f = KvFollower("real.0", addrs, put, AgentMetrics("real"), zctx, interval=0.1)
    return f, asyncio.create_task(f.run()), zctx


async def _stop(task: asyncio.Task[None], zctx: zmq.asyncio.Context) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    zctx.term()


async def _until(pred: object, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return True
        await asyncio.sleep(0.2)
    return False


async def test_vllm_kv_events_name_the_prompts_blocks(
    tiny_model: Path, tmp_path: Path, timings: Timings
) -> None:
    pub, replay = free_port(), free_port()
    section = engine_section(tiny_model)
    section["engine_config"] = {
        **section["engine_config"],
        "enable_prefix_caching": True,
        "kv_events_config": {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{pub}",
            "replay_endpoint": f"tcp://*:{replay}",
            "topic": "kv",
        },
    }
    addrs = KvAddrs({}, f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{replay}")
    with VllmProc(section, Role.UNION, tmp_path, "kv") as engine:
        timings.add("kv events: vLLM start-up", engine.wait_healthy(STARTUP_TIMEOUT))
        views: list[bytes] = []
        live, task, zctx = await _follow(addrs, views)
        try:
            await asyncio.sleep(1.0)  # the SUB socket joined
            body = {"model": "tiny", "prompt": PROMPT_IDS, "max_tokens": 2, "temperature": 0}
            await asyncio.to_thread(post_json, f"{engine.url}/v1/completions", body)
            want = prompt_chain(PROMPT_IDS, BLOCK)
            assert len(want) == 3
            ok = await _until(lambda: set(want) <= set(live.blocks.chains()), 30.0)
            assert ok, (
                f"vLLM's BlockStored events did not name the prompt's blocks: follower holds "
                f"{len(live.blocks)} blocks, block size {live.blocks.block_size}, expected {len(want)}; "
                f"malformed {live.malformed}, orphans {live.blocks.orphans}\n{engine.tail()}"
            )
            assert live.malformed == 0
            assert live.blocks.block_size == BLOCK
            await _until(lambda: bool(views) and set(want) <= decode_view(views[-1]).blocks, 5.0)
            assert set(want) <= decode_view(views[-1]).blocks  # what goes into motor_kvview
        finally:
            await _stop(task, zctx)
        # A follower that starts now learns the same blocks from the replay socket alone.
        late_views: list[bytes] = []
        late, task, zctx = await _follow(addrs, late_views)
        try:
            assert await _until(lambda: set(want) <= set(late.blocks.chains()), 15.0), (
                f"the replay socket did not give the blocks back: {len(late.blocks)} blocks"
            )
        finally:
            await _stop(task, zctx)


async def test_vllm_kv_view_through_the_whole_cluster(
    tiny_model: Path, tmp_path: Path, timings: Timings
) -> None:
    """vLLM launched by a node agent with `kv_events_config` (ipc sockets the agent picks), the
    agent's view in motor_kvview, the coordinator's fold: a token-id prompt sent through the
    coordinator shows up as the prompt's blocks in its `/v1/kvview`."""
    section = engine_section(tiny_model)
    section["engine_config"] = {
        **section["engine_config"],
        "enable_prefix_caching": True,
        "kv_events_config": {"enable_kv_cache_events": True},
    }
    raw = cluster_config(union={**section, "instances": 1})
    raw["coordinator"] = {**raw["coordinator"], "policy": {"union": "kv_aware"}}
    async with real_cluster(tmp_path / "c", raw, nodes=1) as rc:
        took = await rc.wait_for(
            "the union instance ACTIVE", lambda s: rc.active(Role.UNION), STARTUP_TIMEOUT
        )
        timings.add("kv events: cluster start-up to ACTIVE", took)
        body = {"model": "tiny", "prompt": PROMPT_IDS, "max_tokens": 2, "temperature": 0}
        await asyncio.to_thread(post_json, f"{rc.base_url}/completions", body)
        want = len(prompt_chain(PROMPT_IDS, BLOCK))
        mgmt = rc.cluster.coordinator_url

        def blocks() -> int:
            view = json.loads(get_text(f"{mgmt}/v1/kvview"))
            return max((d["blocks"] for d in view["data"]), default=0)

        assert await _until(lambda: blocks() >= want, 30.0), (
            f"the coordinator's view: {get_text(f'{mgmt}/v1/kvview')}"
        )
