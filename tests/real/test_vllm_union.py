"""Union on real vLLM: assembled by the controller, launched by a node agent, served through
the coordinator to the `openai` SDK; then the engine is killed -9 and comes back by itself.

The cluster is module-scoped and the tests run in file order: the kill test reuses it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

from core.events import InstanceState, Role
from tests.real.cluster import RealCluster, cluster_config, engine_pid, group_members, real_cluster
from tests.real.conftest import LONG, MAX_TOKENS, PD_PROMPTS, Timings
from tests.real.vllm_proc import STARTUP_TIMEOUT, engine_section, get_text, metric
from tests.shapes import same_information

pytestmark = [pytest.mark.real, pytest.mark.timeout(1800)]

CHAT = [{"role": "user", "content": "Tell me about the event log of a control plane"}]


@pytest.fixture(scope="module")
async def union(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, timings: Timings
) -> AsyncIterator[RealCluster]:
    raw = cluster_config(union={**engine_section(tiny_model), "instances": 1})
    async with real_cluster(tmp_path_factory.mktemp("union"), raw, nodes=1) as rc:
        took = await rc.wait_for(
            "the union instance ACTIVE", lambda s: rc.active(Role.UNION), STARTUP_TIMEOUT
        )
        timings.add("union cluster: start-up to ACTIVE (vLLM load included)", took)
        yield rc
        t0 = time.monotonic()
    timings.add("union cluster: stop (engine included)", time.monotonic() - t0)


def sdk(rc: RealCluster) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=rc.base_url, api_key="none", max_retries=0, timeout=300)


async def test_union_serves_chat_and_completions_through_the_coordinator(
    union: RealCluster, timings: Timings, reference: dict[str, str]
) -> None:
    client = sdk(union)
    try:
        with timings.phase("union cluster: SDK requests"):
            models = [m.id async for m in client.models.list()]
            assert "tiny" in models
            comp = await client.completions.create(
                model="tiny", prompt="Hello, the controller", max_tokens=MAX_TOKENS
            )
            assert comp.choices[0].text and comp.usage is not None
            assert comp.usage.completion_tokens == MAX_TOKENS
            streamed = [
                ch.choices[0].text
                async for ch in await client.completions.create(
                    model="tiny",
                    prompt="Hello, the controller",
                    max_tokens=MAX_TOKENS,
                    temperature=0,
                    stream=True,
                )
                if ch.choices
            ]
            plain = await client.completions.create(
                model="tiny", prompt="Hello, the controller", max_tokens=MAX_TOKENS, temperature=0
            )
            assert "".join(streamed) == plain.choices[0].text
            chat = await client.chat.completions.create(
                model="tiny", messages=CHAT, max_tokens=MAX_TOKENS, temperature=0
            )
            assert chat.choices[0].message.content
            pieces = [
                ch.choices[0].delta.content or ""
                async for ch in await client.chat.completions.create(
                    model="tiny", messages=CHAT, max_tokens=MAX_TOKENS, temperature=0, stream=True
                )
                if ch.choices
            ]
            assert "".join(pieces) == chat.choices[0].message.content
            # Greedy answers for the P/D tests to compare against.
            for prompt in PD_PROMPTS:
                r = await client.completions.create(
                    model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
                )
                reference[prompt] = r.choices[0].text
    finally:
        await client.close()
    # The node agent launched the real vLLM, whose ZMQ sockets live in the engine's own dir.
    assert "-m vllm.entrypoints.cli.main serve" in union.engine_log(Role.UNION)
    rpc = Path(tempfile.gettempdir()) / "motor-vllm" / f"127.0.0.1-{union.engine_port(Role.UNION)}" / "rpc"
    assert any(rpc.iterdir()), f"no vLLM sockets in {rpc}"


async def test_a_long_whole_answer_is_vllms_own_body_folded_from_its_stream(union: RealCluster) -> None:
    """A whole answer of `continue_whole_from_tokens` or more is asked of vLLM as a stream (with
    its usage in every chunk, so that a cut could be continued) and folded: the client gets the
    body vLLM answers for the same request whole, keys, text, finish_reason and usage alike."""
    import aiohttp
    import orjson

    base, engine = union.cluster.coordinator_url, f"http://127.0.0.1:{union.engine_port(Role.UNION)}"
    common = {"model": "tiny", "max_tokens": LONG, "temperature": 0, "ignore_eos": True}
    bodies = {
        "/v1/completions": {**common, "prompt": "Hello, the controller"},
        "/v1/chat/completions": {**common, "messages": CHAT},
    }

    def folded() -> float:
        return metric(get_text(f"{base}/metrics"), "motor_coordinator_whole_folded_total")

    async with aiohttp.ClientSession() as s:
        before = folded()
        for path, body in bodies.items():
            async with s.post(f"{engine}{path}", json=body) as r:
                own = orjson.loads(await r.read())
                assert r.status == 200, own
            async with s.post(f"{base}{path}", json=body) as r:
                via = orjson.loads(await r.read())
                assert r.status == 200, via
            # Every value vLLM's own answer carries is in the folded one; what the fold adds is
            # in vLLM's answer too. Only null vendor fields a stream never shows may be missing
            # (0.32's `metrics`, `service_tier`, `ec_transfer_params`, `routed_experts` …).
            assert same_information(via, own, skip={"id", "created"}), (path, via, own)
            assert via["usage"]["completion_tokens"] == LONG
        assert folded() - before == len(bodies)  # both were folded, not passed through whole


async def test_seed003_routes_vllm_serves_pass_through_the_coordinator(union: RealCluster) -> None:
    """vLLM's /tokenize and /detokenize through the coordinator; /v1/models/{id} from its table;
    /generate (SGLang only) is a 501 naming the route; /v1/score reaches vLLM (its own answer)."""
    import aiohttp
    import orjson

    base = union.cluster.coordinator_url
    prompt = "Hello, the controller"
    async with aiohttp.ClientSession() as s:
        async with s.post(
            f"{base}/tokenize", json={"model": "tiny", "prompt": prompt, "add_special_tokens": False}
        ) as r:
            tok = await r.json()
            assert r.status == 200, tok
        assert tok["count"] == len(tok["tokens"]) > 0 and tok["max_model_len"] > 0
        async with s.post(f"{base}/detokenize", json={"model": "tiny", "tokens": tok["tokens"]}) as r:
            assert r.status == 200 and (await r.json())["prompt"] == prompt
        chat = {"model": "tiny", "messages": CHAT}
        async with s.post(f"{base}/tokenize", json=chat) as r:
            assert r.status == 200 and (await r.json())["count"] > tok["count"]
        async with s.get(f"{base}/v1/models/tiny") as r:
            assert r.status == 200 and (await r.json())["id"] == "tiny"
        async with s.post(f"{base}/generate", json={"model": "tiny", "text": prompt}) as r:
            err = orjson.loads(await r.read())
            assert (
                r.status == 501
                and "/generate" in err["error"]["message"]
                and "vllm" in err["error"]["message"]
            )
        async with s.post(f"{base}/v1/score", json={"model": "tiny", "text_1": "a", "text_2": ["b"]}) as r:
            # vLLM may serve /v1/score: the coordinator routes it there and passes on vLLM's own
            # answer (a generative model is refused by vLLM itself, not by a coordinator 501).
            assert r.status != 501 and "route_not_supported" not in await r.text()


async def test_vllms_logprob_and_plain_streams_are_told_apart(union: RealCluster) -> None:
    """Continuation fidelity against vLLM's own chunk shapes: a chat stream asking for logprobs
    (its chunks carry them) is refused a continuation by its body, a plain one is continuable,
    and the fold reads both cleanly. (A tool-call stream cannot be had from this engine: vLLM
    0.32 serves a named tool_choice only with a tool-call parser, and every parser needs special
    tokens the tiny model's tokenizer lacks; its `tool_calls` delta shape is table-tested in
    tests/unit/test_coord_continuation_fidelity.py from vLLM's protocol.)"""
    import aiohttp

    from coordinator.proxy.continuation import ProgressFold, not_continuable

    engine = f"http://127.0.0.1:{union.engine_port(Role.UNION)}"
    common = {"model": "tiny", "messages": CHAT, "max_tokens": 24, "temperature": 0, "stream": True}
    bodies = {"logprobs": {**common, "logprobs": True, "top_logprobs": 2}, "plain": common}
    progress = {}
    async with aiohttp.ClientSession() as s:
        for name, body in bodies.items():
            async with s.post(f"{engine}/v1/chat/completions", json=body) as r:
                raw = await r.read()
                assert r.status == 200, raw[:500]
            if name == "logprobs":
                assert b'"top_logprobs"' in raw  # vLLM's chunks carry them
            fold = ProgressFold()
            fold.feed(raw)
            progress[name] = fold.result()
            assert progress[name].clean and progress[name].text, (name, raw[-300:])
            assert progress[name].beyond_text is None
    assert "'logprobs'" in (not_continuable(bodies["logprobs"], progress["logprobs"]) or "")
    assert not_continuable(bodies["plain"], progress["plain"]) is None


async def test_kill9_engine_reported_dead_and_restarted(
    union: RealCluster, timings: Timings, reference: dict[str, str]
) -> None:
    assert union.active(Role.UNION)
    iid = union.instances(Role.UNION)[0]
    pid = engine_pid(union.engine_port(Role.UNION))
    mark = union.tail.index()
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    dead = await union.wait_dead(after=mark, within=30)
    dead_s = time.monotonic() - t0
    timings.add("kill -9: engine reported DEAD after", dead_s)
    assert dead.data.exit_code == -signal.SIGKILL and "SIGKILL" in dead.data.reason
    assert dead_s < 10  # the agent awaits its child's exit: no health timeout involved
    await union.wait_for(
        "the instance to leave ACTIVE", lambda s: s.instances[iid].state != InstanceState.ACTIVE, 60
    )
    took = await union.wait_for(
        "the instance ACTIVE again", lambda s: s.instances[iid].state == InstanceState.ACTIVE, STARTUP_TIMEOUT
    )
    timings.add("kill -9: restart to ACTIVE again (vLLM reload included)", took)
    assert engine_pid(union.engine_port(Role.UNION)) != pid
    # vLLM's engine core and worker outlive a SIGKILLed API server; the agent reaped them.
    assert not group_members(pid), f"left over from the killed engine: {group_members(pid)}"
    client = sdk(union)
    try:
        prompt = PD_PROMPTS[0]
        # Routing may lag the ACTIVE event by a heartbeat; the SDK's own retry covers that gap.
        for attempt in range(30):
            try:
                r = await client.completions.create(
                    model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0
                )
                break
            except openai.APIStatusError:
                if attempt == 29:
                    raise
                await asyncio.sleep(1.0)
        if prompt in reference:
            assert r.choices[0].text == reference[prompt]  # same weights, same greedy answer
        else:
            assert r.choices[0].text
    finally:
        await client.close()
