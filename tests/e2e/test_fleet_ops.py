"""Fleet operations and LoRA adapters on a whole local cluster (issue 21 item 2).

Real processes: nats-server (per-role users: a subject the operator CLI, the controller or a
node agent may not publish fails), a controller, a coordinator, two node agents with builtin
engines (two union instances). The operator acts through the `motor` CLI; clients use the
official `openai` SDK. Run in order (module-scoped cluster).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from core.events import InstanceState
from tests.e2e.test_cluster import motor
from tests.localcluster import Harness, cluster_config, running_cluster


def _active(s: Any) -> list[int]:
    return sorted(i for i, r in s.instances.items() if r.state == InstanceState.ACTIVE)


@pytest.fixture(scope="module")
async def h(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Harness]:
    cfg = cluster_config(union={"instances": 2}, prefill={"instances": 0}, decode={"instances": 0})
    async with running_cluster(
        tmp_path_factory.mktemp("fleet"),
        cfg,
        nodes=2,
        ready="two ACTIVE union instances",
        ready_pred=lambda s: len(_active(s)) >= 2,
    ) as harness:
        yield harness


async def _get(url: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200, await r.text()
        return await r.json(content_type=None)


async def _post(url: str, body: dict[str, Any]) -> int:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
        return r.status


def _engines(h: Harness) -> dict[int, str]:
    return {iid: f"http://127.0.0.1:{h.engine_port(iid)}" for iid in _active(h.state)}


def _results(h: Harness, op_id_prefix: str) -> dict[str, list[str]]:
    """node id -> outcomes of its engines, from the log's `node.engine_op_completed`."""
    out: dict[str, list[str]] = {}
    for r in h.log:
        if r.event.type == "node.engine_op_completed" and r.event.data.op_id.startswith(op_id_prefix):
            out[r.event.data.node_id] = [x.outcome for x in r.event.data.results]
    return out


async def _fleet(h: Harness, *args: str) -> tuple[str, str]:
    proc = await motor(h, *args, "--model", "motor-sim", "--wait-timeout", "60")
    op_id = proc.stdout.split()[1]  # "<op> <op id prefix> on <model> requested, seq N"
    assert "done:" in proc.stdout, proc.stdout
    return op_id, proc.stdout


async def test_each_fleet_op_reaches_every_engine_and_its_results_are_in_the_log(h: Harness) -> None:
    engines = _engines(h)
    before = {i: (await _get(u + "/admin/engine_state"))["weights_version"] for i, u in engines.items()}
    for op in ("flush-cache", "reload-weights", "pause", "continue"):
        op_id, out = await _fleet(h, "fleet", op)
        assert "2 ok, 0 unsupported, 0 failed" in out, out
        assert _results(h, op_id) == {n: ["ok"] for n in h.state.nodes}, op
        assert h.seen("controller.fleet_op_completed", op=op, ok=2)
    after = {i: (await _get(u + "/admin/engine_state"))["weights_version"] for i, u in engines.items()}
    assert after == {i: v + 1 for i, v in before.items()}


async def test_a_sleeping_fleet_takes_no_requests_until_woken(h: Harness) -> None:
    client = openai.AsyncOpenAI(base_url=h.base_url, api_key="x", max_retries=0, timeout=30)
    _, out = await _fleet(h, "fleet", "sleep", "--level", "2")
    assert "2 ok" in out
    for u in _engines(h).values():
        assert (await _get(u + "/admin/engine_state"))["asleep"] is True
    with pytest.raises(openai.APIStatusError) as exc:
        await client.completions.create(model="motor-sim", prompt="hello", max_tokens=2)
    assert exc.value.status_code == 503 and "asleep" in str(exc.value)  # the coordinator's reason
    await _fleet(h, "fleet", "wake")
    r = await client.completions.create(model="motor-sim", prompt="hello", max_tokens=2)
    assert r.choices[0].text


async def test_a_lora_adapter_is_listed_and_served_only_where_it_loaded(h: Harness, tmp_path: Path) -> None:
    client = openai.AsyncOpenAI(base_url=h.base_url, api_key="x", max_retries=0, timeout=30)
    engines = _engines(h)
    first, second = sorted(engines)
    adapter = tmp_path / "sql-lora"
    adapter.mkdir()
    # The first engine has an adapter of that name already: its load fails (400), so the log
    # says only the second has it, and the coordinator routes `model: sql-lora` there alone.
    assert (
        await _post(
            engines[first] + "/v1/load_lora_adapter", {"lora_name": "sql-lora", "lora_path": str(tmp_path)}
        )
        == 200
    )
    op_id, out = await _fleet(h, "lora", "load", "sql-lora", str(adapter))
    assert "1 ok, 0 unsupported, 1 failed" in out, out
    assert sorted(_results(h, op_id).values()) == [["failed"], ["ok"]]
    models = [m.id async for m in client.models.list()]
    assert "sql-lora" in models and "motor-sim" in models
    prompts = [f"adapter question {i}" for i in range(6)]
    for p in prompts:
        r = await client.completions.create(model="sql-lora", prompt=p, max_tokens=2)
        assert r.model == "sql-lora"
    seen = {i: {row["prompt"] for row in await _get(u + "/admin/requests")} for i, u in engines.items()}
    assert set(prompts) <= seen[second]
    assert not set(prompts) & seen[first]
    await _fleet(h, "lora", "unload", "sql-lora")
    with pytest.raises(openai.NotFoundError):
        await client.completions.create(model="sql-lora", prompt="gone", max_tokens=2)
    bad = await motor(h, "fleet", "flush-cache", "--model", "nope", check=False)
    assert bad.returncode == 2 and "no instance serves it" in bad.stderr
