"""P/D on real vLLM through the coordinator's vLLM handoff adapter.

ExampleConnector (KV through files in a shared dir): greedy P/D answers equal the union
answers and the decode engine counts the prompt tokens it took from the prefill's KV as
external prefix-cache hits. NixlConnector (UCX over TCP, host buffers): one smoke request,
timed. Each phase runs its own cluster; one engine per core.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from core.events import Role
from tests.real.cluster import RealCluster, cluster_config, real_cluster
from tests.real.conftest import LONG, MAX_TOKENS, PD_PROMPTS, Timings
from tests.real.pd_direct import connector_tokens, ensure_reference
from tests.real.vllm_proc import (
    STARTUP_TIMEOUT,
    engine_section,
    example_connector,
    get_text,
    metric,
    nixl_connector,
)

pytestmark = [pytest.mark.real, pytest.mark.timeout(1800)]


def pd_config(model: Path, ktc: dict[str, Any]) -> dict[str, Any]:
    # One core each: vLLM's default binding would put both workers on core 0.
    def section(core: str) -> dict[str, Any]:
        sec = engine_section(model, kv_transfer_config=ktc, env={"VLLM_CPU_OMP_THREADS_BIND": core})
        return {**sec, "instances": 1, "dispatch_profile": "handoff"}

    return cluster_config(prefill=section("0"), decode=section("1"))


async def start_pd(rc: RealCluster, timings: Timings, name: str) -> None:
    took = await rc.wait_for(
        "the prefill and decode instances ACTIVE",
        lambda s: rc.active(Role.PREFILL) and rc.active(Role.DECODE),
        STARTUP_TIMEOUT,
    )
    timings.add(f"{name}: start-up to ACTIVE (two vLLM loads)", took)


def engine_url(rc: RealCluster, role: Role) -> str:
    return f"http://127.0.0.1:{rc.engine_port(role)}"


async def test_pd_example_connector_equals_union_and_decode_hits_external_kv(
    tmp_path: Path, tiny_model: Path, timings: Timings, reference: dict[str, str]
) -> None:
    ref = ensure_reference(reference, tiny_model, tmp_path, timings)
    raw = pd_config(tiny_model, example_connector(tmp_path / "kv"))
    async with real_cluster(tmp_path / "cluster", raw, nodes=2) as rc:
        await start_pd(rc, timings, "P/D ExampleConnector")
        client = openai.AsyncOpenAI(base_url=rc.base_url, api_key="none", max_retries=0, timeout=300)
        try:
            with timings.phase("P/D ExampleConnector: requests"):
                moved = 0
                for prompt in PD_PROMPTS:
                    r = await client.completions.create(
                        model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
                    )
                    assert r.choices[0].text == ref[prompt]
                    assert r.usage is not None
                    moved += connector_tokens(r.usage.prompt_tokens)
                chat = [{"role": "user", "content": PD_PROMPTS[1]}]
                plain = await client.chat.completions.create(
                    model="tiny", messages=chat, max_tokens=MAX_TOKENS, temperature=0
                )
                pieces = [
                    ch.choices[0].delta.content or ""
                    async for ch in await client.chat.completions.create(
                        model="tiny", messages=chat, max_tokens=MAX_TOKENS, temperature=0, stream=True
                    )
                    if ch.choices
                ]
                assert plain.choices[0].message.content
                assert "".join(pieces) == plain.choices[0].message.content
                # A long whole answer is asked of the decode as a stream and folded (it could
                # be continued if the decode died): the same text as the stream, 40 tokens.
                long = {"max_tokens": LONG, "temperature": 0, "extra_body": {"ignore_eos": True}}
                folded = await client.chat.completions.create(model="tiny", messages=chat, **long)
                pieces = [
                    ch.choices[0].delta.content or ""
                    async for ch in await client.chat.completions.create(
                        model="tiny", messages=chat, stream=True, **long
                    )
                    if ch.choices
                ]
                assert folded.usage is not None and folded.usage.completion_tokens == LONG
                assert folded.choices[0].message.content == "".join(pieces)
        finally:
            await client.close()
        decode_metrics = get_text(f"{engine_url(rc, Role.DECODE)}/metrics")
        prefill_metrics = get_text(f"{engine_url(rc, Role.PREFILL)}/metrics")
        # The completions' prompts went to both engines; the decode took whole blocks from P.
        assert (
            metric(decode_metrics, "vllm:external_prefix_cache_hits_total") >= moved >= 32 * len(PD_PROMPTS)
        )
        assert metric(prefill_metrics, "vllm:prompt_tokens_total") > 0
        assert "External Cache Hit!" in rc.engine_log(Role.DECODE)
        # Each prefill leg generated exactly one token (the adapter's max_tokens=1).
        assert metric(prefill_metrics, "vllm:generation_tokens_total") == len(PD_PROMPTS) + 4
        assert (
            metric(get_text(f"{rc.cluster.coordinator_url}/metrics"), "motor_coordinator_whole_folded_total")
            == 1
        )


async def test_pd_nixl_smoke(
    tmp_path: Path, tiny_model: Path, timings: Timings, reference: dict[str, str]
) -> None:
    ref = ensure_reference(reference, tiny_model, tmp_path, timings)
    async with real_cluster(tmp_path / "cluster", pd_config(tiny_model, nixl_connector()), nodes=2) as rc:
        await start_pd(rc, timings, "P/D NIXL")
        client = openai.AsyncOpenAI(base_url=rc.base_url, api_key="none", max_retries=0, timeout=600)
        try:
            t0 = time.monotonic()
            r = await client.completions.create(
                model="tiny", prompt=PD_PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0
            )
            timings.add("P/D NIXL: one request through the coordinator", time.monotonic() - t0)
        finally:
            await client.close()
        assert r.choices[0].text == ref[PD_PROMPTS[0]]
        decode_metrics = get_text(f"{engine_url(rc, Role.DECODE)}/metrics")
        assert metric(decode_metrics, "vllm:external_prefix_cache_hits_total") > 0
        # The KV really crossed over NIXL (a failed read would be recomputed, just slower).
        # Transfer stats reach /metrics with the engine's next stats update: polled.
        deadline = time.monotonic() + 60
        while metric(decode_metrics, "vllm:nixl_xfer_time_seconds_count") < 1 and time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            decode_metrics = get_text(f"{engine_url(rc, Role.DECODE)}/metrics")
        assert metric(decode_metrics, "vllm:nixl_xfer_time_seconds_count") >= 1
        assert metric(decode_metrics, "vllm:nixl_num_failed_transfers_total") == 0
    # The agents stopped the engines through vLLM's own shutdown (SIGTERM to the main process
    # first; the order itself is pinned in tests/integration/test_engine_stop_order.py).
    for role in (Role.PREFILL, Role.DECODE):
        assert "[shutdown] API server: shutdown triggered" in rc.engine_log(role)
