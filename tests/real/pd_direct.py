"""The vLLM handoff done by hand against real engines (what the coordinator's adapter does).

Prefill: the prompt with `max_tokens=1`, `stream=false` and
`kv_transfer_params={"do_remote_decode": true, "do_remote_prefill": false}`; decode: the same
request with the prefill response's `kv_transfer_params`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from core.events import Role
from tests.real.conftest import MAX_TOKENS, PD_PROMPTS, Timings
from tests.real.vllm_proc import VllmProc, engine_section, post_json


def completion(url: str, prompt: str, max_tokens: int = MAX_TOKENS, **extra: Any) -> dict[str, Any]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    return post_json(f"{url}/v1/completions", body, timeout=300)


def handoff(
    prefill_url: str, decode_url: str, prompt: str
) -> tuple[dict[str, Any], dict[str, Any] | None, float]:
    """(decode response, the prefill's kv_transfer_params, decode seconds) for one P/D request."""
    p = completion(
        prefill_url,
        prompt,
        max_tokens=1,
        stream=False,
        kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False},
    )
    params = p.get("kv_transfer_params")
    extra = {"kv_transfer_params": params} if params else {}
    t0 = time.monotonic()
    d = completion(decode_url, prompt, **extra)
    return d, params, time.monotonic() - t0


def connector_tokens(prompt_tokens: int, block_size: int = 32) -> int:
    """Prompt tokens ExampleConnector hands over: whole blocks of all but the last token."""
    return (prompt_tokens - 2) // block_size * block_size


def union_answers(url: str) -> dict[str, str]:
    return {p: str(completion(url, p)["choices"][0]["text"]) for p in PD_PROMPTS}


def ensure_reference(
    reference: dict[str, str], model: Path, log_dir: Path, timings: Timings
) -> dict[str, str]:
    """The greedy union answers; starts a union engine only if no earlier test recorded them."""
    if not reference:
        with VllmProc(engine_section(model), Role.UNION, log_dir, "reference") as eng:
            timings.add("reference union engine start-up", eng.wait_healthy())
            reference.update(union_answers(eng.url))
    return reference
