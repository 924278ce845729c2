"""The builtin engine's non-OpenAI surface: health, metrics, router probes, snapshot, abort,
KV-block waiting, timing, and the HTTP server itself (keep-alive, pipelining, bad input)."""

from __future__ import annotations

import asyncio
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.integration.builtin_proc import BuiltinEngineProc, http

MODEL = "motor-sim"


@pytest.fixture(scope="module")
def eng(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltinEngineProc]:
    args = ("--model", MODEL, "--itl-ms", "2", "--ttft-base-ms", "1", "--prefill-tokens-per-s", "4000")
    with BuiltinEngineProc(tmp_path_factory.mktemp("eng"), *args, name="endpoints") as e:
        yield e


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus exposition."""
    for line in text.splitlines():
        named = line.startswith(name + "{") or line.startswith(name + " ")
        if named and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in metrics")


def scrape(eng: BuiltinEngineProc) -> str:
    status, headers, body = http("GET", eng.url + "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    return body.decode()


def chat(eng: BuiltinEngineProc, **extra: object) -> tuple[int, dict[str, object]]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4, **extra}
    status, _, raw = http("POST", eng.url + "/v1/chat/completions", body)
    return status, orjson.loads(raw) if raw else {}


def test_health_and_router_probes(eng: BuiltinEngineProc) -> None:
    status, _, body = http("GET", eng.url + "/health")
    assert (status, body) == (200, b"")
    for path in ("/server_info", "/get_server_info"):
        status, _, raw = http("GET", eng.url + path)
        info = orjson.loads(raw)
        assert status == 200 and info["served_model_name"] == MODEL and info["disaggregation_mode"] == "null"
        assert info["max_total_num_tokens"] == 4096 * 16 and "internal_states" in info
    for path in ("/model_info", "/get_model_info"):
        status, _, raw = http("GET", eng.url + path)
        info = orjson.loads(raw)
        assert status == 200 and info["model_path"] == MODEL and info["is_generation"] is True
    status, _, raw = http("GET", eng.url + "/get_load")
    load = orjson.loads(raw)
    assert status == 200 and load[0]["num_reqs"] == 0 and load[0]["num_waiting_reqs"] == 0
    status, _, raw = http("GET", eng.url + "/v1/models/" + MODEL)
    assert status == 200 and orjson.loads(raw)["owned_by"] == "motor-builtin-simulator"
    status, _, raw = http("GET", eng.url + "/fault_tolerance/status")
    assert status == 200 and orjson.loads(raw)["status"] == "healthy"


def test_metrics_use_vllm_names_and_count(eng: BuiltinEngineProc) -> None:
    before = scrape(eng)
    status, body = chat(eng, max_tokens=5)
    assert status == 200
    after = scrape(eng)
    labels = {"model_name": MODEL}
    for gauge in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert metric(after, gauge, **labels) == 0
    usage = body["usage"]
    assert isinstance(usage, dict)
    assert (
        metric(after, "vllm:prompt_tokens_total", **labels)
        - metric(before, "vllm:prompt_tokens_total", **labels)
        == usage["prompt_tokens"]
    )
    assert (
        metric(after, "vllm:generation_tokens_total", **labels)
        - metric(before, "vllm:generation_tokens_total", **labels)
        == 5
    )
    assert (
        metric(after, "vllm:time_to_first_token_seconds_count", **labels)
        == metric(before, "vllm:time_to_first_token_seconds_count", **labels) + 1
    )
    assert (
        metric(after, "vllm:inter_token_latency_seconds_count", **labels)
        == metric(before, "vllm:inter_token_latency_seconds_count", **labels) + 4
    )
    assert 'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="motor-sim"}' in after


def test_snapshot_endpoints_status_codes(eng: BuiltinEngineProc, tmp_path: Path) -> None:
    assert http("POST", eng.url + "/suspend")[0] == 400
    assert http("POST", eng.url + "/resume?model_path=/x")[0] == 400
    assert http("POST", eng.url + "/resume?data_parallel_master_ip=10.0.0.1")[0] == 400
    save = tmp_path / "weights"
    status, _, body = http("POST", eng.url + f"/suspend?model_save_path={save}")
    assert (status, body) == (200, b"")
    assert (save / "builtin-weights.json").exists()
    status, err = chat(eng)
    assert status == 503 and "suspended" in str(err["error"])
    status, _, body = http("POST", eng.url + "/device_unlock")
    assert (status, body) == (200, b"")
    status, _, body = http("POST", eng.url + f"/resume?data_parallel_master_ip=10.0.0.1&model_path={save}")
    assert (status, body) == (200, b"")
    assert chat(eng)[0] == 200


def test_abort_request_by_rid_ends_a_running_stream(eng: BuiltinEngineProc) -> None:
    async def run() -> tuple[list[dict[str, object]], int]:
        body = {"model": MODEL, "prompt": "long story", "max_tokens": 2000, "stream": True, "rid": "abort-me"}
        async with aiohttp.ClientSession() as s, s.post(eng.url + "/v1/completions", json=body) as resp:
            events: list[dict[str, object]] = []
            async for line in resp.content:
                if not line.startswith(b"data: {"):
                    continue
                events.append(orjson.loads(line[6:]))
                if len(events) == 3:
                    async with s.post(eng.url + "/abort_request", json={"rid": "abort-me"}) as ab:
                        aborted = (await ab.json())["aborted"]
            return events, aborted

    events, aborted = asyncio.run(run())
    assert aborted == 1
    last = events[-1]["choices"]
    assert isinstance(last, list) and last[0]["finish_reason"] == "abort"
    assert len(events) < 100
    assert metric(scrape(eng), "vllm:num_requests_running", model_name=MODEL) == 0


def test_abort_request_needs_a_rid(eng: BuiltinEngineProc) -> None:
    status, _, raw = http("POST", eng.url + "/abort_request", {})
    assert status == 400 and orjson.loads(raw)["error"]["param"] == "rid"
    status, _, raw = http("POST", eng.url + "/abort_request", {"rid": "unknown"})
    assert status == 200 and orjson.loads(raw) == {"aborted": 0}


def test_ttft_grows_with_prompt_tokens(eng: BuiltinEngineProc) -> None:
    # 4000 prompt tokens/s: 3000 uncached tokens take ~0.75 s, 4 tokens ~1 ms.
    def ttft(prompt: str) -> float:
        t0 = time.monotonic()
        status, _, _ = http("POST", eng.url + "/v1/completions", {"prompt": prompt, "max_tokens": 1})
        assert status == 200
        return time.monotonic() - t0

    short = ttft("a short prompt")
    long = ttft(" ".join(f"unique{i}x" for i in range(3000)))
    assert long - short > 0.4


def test_requests_wait_when_kv_blocks_run_out(tmp_path: Path) -> None:
    # 8 blocks of 16 tokens; each request needs 5 blocks, so the second waits for the first.
    args = ("--num-blocks", "8", "--block-size", "16", "--itl-ms", "20", "--max-model-len", "256")
    with BuiltinEngineProc(tmp_path, *args, name="small") as small:

        async def run() -> tuple[list[int], float]:
            # Different prompts, so no prefix-cache sharing lowers the need.
            def body(i: int) -> dict[str, object]:
                return {
                    "prompt": " ".join(f"r{i}w{j}" for j in range(40)),
                    "max_tokens": 30,
                    "ignore_eos": True,
                }

            async with aiohttp.ClientSession() as s:

                async def one(i: int) -> int:
                    async with s.post(small.url + "/v1/completions", json=body(i)) as r:
                        await r.read()
                        return r.status

                tasks = [asyncio.ensure_future(one(i)) for i in range(2)]
                waited = 0.0
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and not waited:
                    async with s.get(small.url + "/metrics") as m:
                        waited = metric(await m.text(), "vllm:num_requests_waiting", model_name="motor-sim")
                    await asyncio.sleep(0.02)
                return list(await asyncio.gather(*tasks)), waited

        statuses, waited = asyncio.run(run())
        assert statuses == [200, 200]
        assert waited == 1
        status, _, raw = http("POST", small.url + "/v1/completions", {"prompt": "x", "max_tokens": 200})
        assert status == 400 and "KV cache" in orjson.loads(raw)["error"]["message"]


def _raw_exchange(port: int, payload: bytes, expect_responses: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(payload)
        data = b""
        deadline = time.monotonic() + 10
        while data.count(b"HTTP/1.1 ") < expect_responses or not data.endswith(b"}"):
            if time.monotonic() > deadline:
                break
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


def test_pipelined_requests_are_answered_in_order(eng: BuiltinEngineProc) -> None:
    def req(prompt: str) -> bytes:
        body = orjson.dumps({"prompt": prompt, "max_tokens": 2, "rid": prompt})
        return (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )

    data = _raw_exchange(eng.port, req("first") + req("second") + req("third"), 3)
    ids = re.findall(rb'"id":"cmpl-(\w+)"', data)
    assert ids == [b"first", b"second", b"third"]


def test_bad_http_and_unknown_paths(eng: BuiltinEngineProc) -> None:
    data = _raw_exchange(eng.port, b"NOT HTTP AT ALL\r\n\r\n", 1)
    assert data.startswith(b"HTTP/1.1 400")
    status, _, raw = http("GET", eng.url + "/nope")
    assert status == 404 and orjson.loads(raw)["error"]["code"] == 404
    status, _, raw = http("GET", eng.url + "/v1/completions")
    assert status == 405 and orjson.loads(raw)["error"]["code"] == 405
    status, _, raw = http("POST", eng.url + "/v1/completions", raw=b"{not json")
    assert status == 400 and "JSON" in orjson.loads(raw)["error"]["message"]


@pytest.mark.parametrize("program", [("simengine",), ("deploy.cli", "engine", "builtin")])
def test_cli_rejects_bad_flags_with_a_message(program: tuple[str, ...]) -> None:
    import subprocess
    import sys

    r = subprocess.run(
        [sys.executable, "-m", *program, "--port", "70000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--port" in r.stderr and "Traceback" not in r.stderr


def test_port_in_use_is_a_clear_error(eng: BuiltinEngineProc, tmp_path: Path) -> None:
    clash = BuiltinEngineProc(tmp_path, port=eng.port, name="clash")
    with pytest.raises(RuntimeError, match="cannot serve"):
        clash.start(timeout=30)
    assert clash.proc is not None and clash.proc.returncode == 1


def test_metaserver_relays_to_the_peer(eng: BuiltinEngineProc, tmp_path: Path) -> None:
    with BuiltinEngineProc(tmp_path, "--fast", "--engine-id", "peer-1", name="peer") as peer:
        kv = {"request_id": "m-1", "do_remote_decode": True, "do_remote_prefill": False,
              "remote_engine_id": "peer-1", "remote_host": "127.0.0.1", "remote_port": str(peer.port)}  # fmt: skip
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": "Hello!"}],
            "max_tokens": 5,
            "rid": "m-1",
        }
        status, _, direct = http("POST", peer.url + "/v1/chat/completions", body)
        assert status == 200
        status, _, relayed = http("POST", eng.url + "/v1/metaserver", {**body, "kv_transfer_params": kv})
        assert status == 200
        want, got = orjson.loads(direct), orjson.loads(relayed)
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        status, headers, streamed = http(
            "POST", eng.url + "/v1/metaserver", {**body, "stream": True, "kv_transfer_params": kv}
        )
        assert status == 200 and headers["content-type"].startswith("text/event-stream")
        assert streamed.endswith(b"data: [DONE]\n\n") and streamed.count(b'"content":') == 6
    status, _, raw = http("POST", eng.url + "/v1/metaserver", {**body, "kv_transfer_params": kv})
    assert status == 502 and "cannot reach" in orjson.loads(raw)["error"]["message"]
    status, _, raw = http(
        "POST", eng.url + "/v1/metaserver", {**body, "kv_transfer_params": {"request_id": "x"}}
    )
    assert status == 400 and orjson.loads(raw)["error"]["param"] == "kv_transfer_params"
