"""Fleet operations on real vLLM (dev mode: its own /reset_prefix_cache, /pause, /resume), and
a LoRA adapter through `motor lora load`: built here by hand for the tiny model
(safetensors + adapter_config.json, no peft), loaded by the node agent with vLLM's
`POST /v1/load_lora_adapter`, listed in the coordinator's `/v1/models`, answering
`model: tiny-lora`, and changing the greedy answer (its B matrices are not zero).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest

from core.events import Role
from tests.real.cluster import RealCluster, cluster_config, real_cluster
from tests.real.vllm_proc import ENGINE_CONFIG, STARTUP_TIMEOUT, engine_section

pytestmark = [pytest.mark.real, pytest.mark.timeout(1800)]

RANK = 8
PROMPT = "Hello, the controller"


def build_adapter(model_dir: Path, out: Path, rank: int = RANK, seed: int = 1) -> Path:
    """A PEFT-format LoRA adapter on q_proj and v_proj of every layer of the model in `model_dir`."""
    import numpy as np
    import safetensors.numpy

    cfg = json.loads((model_dir / "config.json").read_text())
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    kv = cfg["num_key_value_heads"] * (h // cfg["num_attention_heads"])
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(layers):
        for mod, out_dim in (("q_proj", h), ("v_proj", kv)):
            key = f"base_model.model.model.layers.{i}.self_attn.{mod}"
            tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((rank, h)) * 0.5).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = (rng.standard_normal((out_dim, rank)) * 0.5).astype(np.float32)
    out.mkdir(parents=True, exist_ok=True)
    safetensors.numpy.save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(model_dir),
        "r": rank,
        "lora_alpha": rank * 2,
        "lora_dropout": 0.0,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="module")
async def lora_union(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path
) -> AsyncIterator[RealCluster]:
    section = engine_section(
        tiny_model, env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_SERVER_DEV_MODE": "1"}
    )
    section["engine_config"] = {**ENGINE_CONFIG, "enable_lora": True, "max_lora_rank": RANK, "max_loras": 2}
    raw = cluster_config(union={**section, "instances": 1})
    async with real_cluster(tmp_path_factory.mktemp("lora"), raw, nodes=1) as rc:
        await rc.wait_for("the union instance ACTIVE", lambda s: rc.active(Role.UNION), STARTUP_TIMEOUT)
        yield rc


def _motor(rc: RealCluster, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        "-m",
        "deploy.cli",
        *args,
        "--nats-url",
        rc.cluster.url,
        "--root",
        str(rc.cluster.root),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


async def test_a_lora_adapter_loads_through_the_log_and_answers_by_name(
    lora_union: RealCluster, tiny_model: Path, tmp_path: Path
) -> None:
    adapter = build_adapter(tiny_model, tmp_path / "tiny-lora")
    proc = await asyncio.to_thread(
        _motor, lora_union, "lora", "load", "tiny-lora", str(adapter), "--model", "tiny"
    )
    assert proc.returncode == 0 and "1 ok, 0 unsupported, 0 failed" in proc.stdout, proc.stdout + proc.stderr
    client = openai.AsyncOpenAI(base_url=lora_union.base_url, api_key="none", max_retries=0, timeout=300)
    models = [m.id async for m in client.models.list()]
    assert "tiny-lora" in models and "tiny" in models
    base = await client.completions.create(model="tiny", prompt=PROMPT, max_tokens=16, temperature=0)
    tuned = await client.completions.create(model="tiny-lora", prompt=PROMPT, max_tokens=16, temperature=0)
    assert tuned.model == "tiny-lora" and tuned.choices[0].text
    assert tuned.choices[0].text != base.choices[0].text  # the adapter's weights took part
    proc = await asyncio.to_thread(_motor, lora_union, "lora", "unload", "tiny-lora", "--model", "tiny")
    assert proc.returncode == 0 and "1 ok" in proc.stdout, proc.stdout + proc.stderr
    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model="tiny-lora", prompt=PROMPT, max_tokens=4)


async def test_fleet_ops_reach_real_vllms_own_routes(lora_union: RealCluster) -> None:
    client = openai.AsyncOpenAI(base_url=lora_union.base_url, api_key="none", max_retries=0, timeout=300)
    for op in ("flush-cache", "pause", "continue"):
        proc = await asyncio.to_thread(_motor, lora_union, "fleet", op, "--model", "tiny")
        assert proc.returncode == 0 and "1 ok, 0 unsupported, 0 failed" in proc.stdout, (op, proc.stdout)
    r = await client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0)
    assert r.choices[0].text  # continued: it serves again
