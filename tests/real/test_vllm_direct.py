"""Real vLLM started exactly as the node agent's backend launches it, driven over HTTP directly.

These pin the engine side on its own (argv, env, connector configs, handoff fields) so a
failure in the cluster tests can be told apart from one in the engine launch.
"""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from core.events import Role
from tests.real.conftest import MAX_TOKENS, PD_PROMPTS, Timings
from tests.real.pd_direct import connector_tokens, ensure_reference, handoff, union_answers
from tests.real.vllm_proc import VllmProc, engine_section, example_connector, get_text, metric, nixl_connector

pytestmark = [pytest.mark.real, pytest.mark.timeout(1800)]


def test_union_engine_from_backend_answers_completion_and_chat(
    tiny_model: Path, tmp_path: Path, timings: Timings, reference: dict[str, str]
) -> None:
    with VllmProc(engine_section(tiny_model), Role.UNION, tmp_path, "union") as eng:
        timings.add("direct: union vLLM start-up", eng.wait_healthy())
        with timings.phase("direct: union requests"):
            client = openai.OpenAI(base_url=f"{eng.url}/v1", api_key="none", timeout=300)
            assert [m.id for m in client.models.list().data] == ["tiny"]
            c = client.completions.create(model="tiny", prompt="Hello, the controller", max_tokens=MAX_TOKENS)
            assert c.usage is not None and c.usage.completion_tokens == MAX_TOKENS
            assert c.choices[0].text
            chat = client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=MAX_TOKENS,
                temperature=0,
            )
            assert chat.choices[0].message.content
            # The chat template was applied: "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n".
            assert chat.usage is not None and chat.usage.prompt_tokens > 4
            pieces = [
                ch.choices[0].delta.content or ""
                for ch in client.chat.completions.create(
                    model="tiny",
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=MAX_TOKENS,
                    temperature=0,
                    stream=True,
                )
                if ch.choices
            ]
            assert "".join(pieces) == chat.choices[0].message.content
            reference.update(union_answers(eng.url))
    assert all(reference[p] for p in PD_PROMPTS)
    # The backend's per-engine socket dir was used (no stray sockets in the shared /tmp).
    assert str(eng.spec.env["VLLM_RPC_BASE_PATH"]).endswith("/rpc")


def test_pd_example_connector_by_hand_equals_union(
    tiny_model: Path, tmp_path: Path, timings: Timings, reference: dict[str, str]
) -> None:
    ref = ensure_reference(reference, tiny_model, tmp_path, timings)
    ktc = example_connector(tmp_path / "kv")
    # One core each: vLLM's default binding would put both workers on core 0.
    p_sec = engine_section(tiny_model, kv_transfer_config=ktc, env={"VLLM_CPU_OMP_THREADS_BIND": "0"})
    d_sec = engine_section(tiny_model, kv_transfer_config=ktc, env={"VLLM_CPU_OMP_THREADS_BIND": "1"})
    with (
        VllmProc(p_sec, Role.PREFILL, tmp_path, "prefill") as p,
        VllmProc(d_sec, Role.DECODE, tmp_path, "decode") as d,
    ):
        with timings.phase("direct: ExampleConnector P+D start-up"):
            p.wait_healthy()
            d.wait_healthy()
        with timings.phase("direct: ExampleConnector P/D requests"):
            moved = 0
            for prompt in PD_PROMPTS:
                out, _, _ = handoff(p.url, d.url, prompt)
                assert out["choices"][0]["text"] == ref[prompt]
                moved += connector_tokens(out["usage"]["prompt_tokens"])
            hits = metric(get_text(f"{d.url}/metrics"), "vllm:external_prefix_cache_hits_total")
        assert '"kv_role":"kv_both"' in " ".join(p.spec.argv)
        assert moved >= 32 * len(PD_PROMPTS)
        assert hits == moved  # the decode engine took those prompt tokens from P's KV, not computed them
        assert "External Cache Hit!" in d.output()


def test_pd_nixl_smoke_by_hand(
    tiny_model: Path, tmp_path: Path, timings: Timings, reference: dict[str, str]
) -> None:
    ref = ensure_reference(reference, tiny_model, tmp_path, timings)
    ktc = nixl_connector()
    p_sec = engine_section(tiny_model, kv_transfer_config=ktc, env={"VLLM_CPU_OMP_THREADS_BIND": "0"})
    d_sec = engine_section(tiny_model, kv_transfer_config=ktc, env={"VLLM_CPU_OMP_THREADS_BIND": "1"})
    with (
        VllmProc(p_sec, Role.PREFILL, tmp_path, "nixl-prefill") as p,
        VllmProc(d_sec, Role.DECODE, tmp_path, "nixl-decode") as d,
    ):
        assert p.spec.env["UCX_TLS"] == "tcp,self"
        assert p.spec.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(p.bootstrap_port)
        with timings.phase("direct: NIXL P+D start-up"):
            p.wait_healthy()
            d.wait_healthy()
        prompt = PD_PROMPTS[0]
        with timings.phase("direct: NIXL P/D request"):
            out, params, decode_s = handoff(p.url, d.url, prompt)
        timings.add("direct: NIXL decode request alone", decode_s)
        assert params is not None and params["remote_port"] == p.bootstrap_port
        assert out["choices"][0]["text"] == ref[prompt]
