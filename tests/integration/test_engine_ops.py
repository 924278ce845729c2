"""The node agent's fleet-operation calls (`nodeagent.engine_ops`) against a real builtin engine:
each op reaches its route and has its effect; an op the engine kind lacks is `unsupported`."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import orjson
import pytest

from core.events import EngineOpResult, FleetOpArgs
from nodeagent.engine_ops import run_one
from nodeagent.host import ProcessHost
from tests.integration.builtin_proc import BuiltinEngineProc, http

MODEL = "motor-sim"


@pytest.fixture(scope="module")
def eng(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltinEngineProc]:
    args = ("--model", MODEL, "--itl-ms", "2", "--ttft-base-ms", "1")
    with BuiltinEngineProc(tmp_path_factory.mktemp("eng"), *args, name="engineops") as e:
        yield e


def state(eng: BuiltinEngineProc) -> dict[str, Any]:
    status, _, body = http("GET", eng.url + "/admin/engine_state")
    assert status == 200
    out: dict[str, Any] = orjson.loads(body)
    return out


async def op(eng: BuiltinEngineProc, name: str, engine_type: str = "builtin", **args: Any) -> EngineOpResult:
    async with aiohttp.ClientSession() as session:
        host = ProcessHost(session)
        return await run_one(host.call, engine_type, eng.url, 0, name, FleetOpArgs(**args), 10.0)


def client(eng: BuiltinEngineProc) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=eng.url + "/v1", api_key="x", max_retries=0)


async def complete(eng: BuiltinEngineProc, model: str = MODEL) -> str:
    r = await client(eng).completions.create(
        model=model, prompt="the quick brown fox jumps over the lazy dog " * 8, max_tokens=3
    )
    return r.choices[0].text


async def test_flush_cache_empties_the_kv_model(eng: BuiltinEngineProc) -> None:
    await complete(eng)
    assert state(eng)["cached_blocks"] > 0
    r = await op(eng, "flush-cache")
    assert r.outcome == "ok" and r.status == 200 and "/reset_prefix_cache" in r.detail
    assert state(eng)["cached_blocks"] == 0


async def test_sleep_refuses_generation_with_503_until_wake(eng: BuiltinEngineProc) -> None:
    assert (await op(eng, "sleep", level=2)).outcome == "ok"
    assert state(eng)["asleep"] is True
    with pytest.raises(openai.APIStatusError) as exc:
        await complete(eng)
    assert exc.value.status_code == 503
    assert (await op(eng, "wake")).outcome == "ok"
    assert await complete(eng)


async def test_pause_holds_new_requests_until_continue(eng: BuiltinEngineProc) -> None:
    assert (await op(eng, "pause")).outcome == "ok"
    held = asyncio.ensure_future(complete(eng))
    await asyncio.sleep(0.5)
    assert not held.done(), "a request went through while generation was paused"
    assert (await op(eng, "continue")).outcome == "ok"
    assert await asyncio.wait_for(held, 10)


async def test_reload_weights_bumps_the_weights_version(eng: BuiltinEngineProc) -> None:
    before = state(eng)["weights_version"]
    r = await op(eng, "reload-weights", path="/models/new")
    assert r.outcome == "ok", r.detail
    assert state(eng)["weights_version"] == before + 1


async def test_lora_load_serves_the_adapter_by_name_and_unload_stops_it(
    eng: BuiltinEngineProc, tmp_path: Path
) -> None:
    r = await op(eng, "lora-load", lora_name="sql-lora", path=str(tmp_path))
    assert r.outcome == "ok", r.detail
    models = [m.id async for m in client(eng).models.list()]
    assert "sql-lora" in models and MODEL in models
    assert await complete(eng, "sql-lora")
    again = await op(eng, "lora-load", lora_name="sql-lora", path=str(tmp_path))
    assert again.outcome == "failed" and again.status == 400
    assert (await op(eng, "lora-unload", lora_name="sql-lora")).outcome == "ok"
    with pytest.raises(openai.NotFoundError):
        await complete(eng, "sql-lora")


async def test_a_missing_adapter_directory_is_a_failed_result_not_a_crash(eng: BuiltinEngineProc) -> None:
    r = await op(eng, "lora-load", lora_name="ghost", path="/nonexistent/adapter")
    assert r.outcome == "failed" and r.status == 400 and "not a directory" in r.detail


async def test_a_route_the_engine_lacks_is_unsupported(eng: BuiltinEngineProc) -> None:
    # vLLM's spelling of continue (`/resume`) is the builtin engine's snapshot route, and
    # SGLang's release route exists; a vLLM-only dev route the engine lacks answers 404.
    r = await op(eng, "pause", engine_type="vllm")  # POST /pause: the builtin answers it
    assert r.outcome == "ok"
    await op(eng, "continue")
    r = await op(eng, "lora-unload", engine_type="sglang", lora_name="never-loaded")
    assert r.outcome == "unsupported" and r.status == 404


async def test_an_engine_that_does_not_answer_is_a_failed_result() -> None:
    async with aiohttp.ClientSession() as session:
        r = await run_one(
            ProcessHost(session).call, "vllm", "http://127.0.0.1:9", 3, "wake", FleetOpArgs(), 2.0
        )
    assert r.outcome == "failed" and r.endpoint_id == 3 and "no answer" in r.detail
