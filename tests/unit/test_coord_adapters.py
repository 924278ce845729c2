"""P/D adapters: the registry by capability, and the exact body fields each protocol sends
(vLLM handoff, SGLang bootstrap). Their whole exchanges run against real engines in
tests/integration/test_coord_pd_paths.py and test_coord_native_routes.py."""

from __future__ import annotations

import inspect
from typing import get_args

import pytest

from coordinator.adapters import REGISTRY, adapter_for, splitting
from coordinator.adapters import bootstrap as sglang
from coordinator.adapters import handoff as vllm
from coordinator.proxy.routes import ROUTES
from core.config import EngineSection
from core.ids import room_id

BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "hi"}],
    "stream": True,
    "stream_options": {"include_usage": True},
    "max_tokens": 50,
    "min_tokens": 3,
    "temperature": 0.5,
}


def test_vllm_prefill_body_exact() -> None:
    out = vllm.prefill_body(BODY, "r#a1")
    assert out == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "max_tokens": 1,
        "temperature": 0.5,
        "request_id": "r#a1",
        "kv_transfer_params": {
            "do_remote_decode": True,
            "do_remote_prefill": False,
            "remote_engine_id": None,
            "remote_block_ids": None,
            "remote_host": None,
            "remote_port": None,
        },
    }
    assert BODY["stream"] is True and "min_tokens" in BODY  # the client's body is untouched


@pytest.mark.parametrize(
    ("given", "expected"),
    [({}, None), ({"max_completion_tokens": 99}, 1)],
)
def test_vllm_prefill_max_completion_tokens_only_if_present(
    given: dict[str, int], expected: int | None
) -> None:
    out = vllm.prefill_body({**BODY, **given}, "r")
    assert out.get("max_completion_tokens") == expected


def test_vllm_decode_body_carries_prefill_kv() -> None:
    kv = {"do_remote_prefill": True, "remote_host": "10.0.0.2", "remote_block_ids": [1, 2]}
    out = vllm.decode_body(BODY, kv, "r#a2")
    assert out == {**BODY, "kv_transfer_params": kv, "request_id": "r#a2"}


def test_vllm_decode_body_drops_client_kv_when_prefill_gave_none() -> None:
    out = vllm.decode_body({**BODY, "kv_transfer_params": {"x": 1}}, None, "r")
    assert "kv_transfer_params" not in out


@pytest.mark.parametrize(
    ("resp", "kv"),
    [
        ({"kv_transfer_params": {"a": 1}}, {"a": 1}),
        ({"kv_transfer_params": None}, None),
        ({"kv_transfer_params": [1]}, None),
        ([], None),
    ],
)
def test_vllm_kv_params_of(resp: object, kv: object) -> None:
    assert vllm.kv_params_of(resp) == kv


def test_sglang_bodies_exact() -> None:
    p, d = sglang.pd_bodies(
        BODY, prefill_host="10.0.0.1", bootstrap_port=8998, pair_id="root", attempt=2, request_id="root#a2"
    )
    extra = {
        "bootstrap_host": "10.0.0.1",
        "bootstrap_port": 8998,
        "bootstrap_room": room_id("root", 2),
        "rid": "root#a2",
        "request_id": "root#a2",
    }
    assert p == {**BODY, **extra}
    assert d == {**BODY, **extra}
    assert 0 <= extra["bootstrap_room"] < 2**63  # type: ignore[operator]


def test_sglang_room_differs_per_attempt() -> None:
    p1, _ = sglang.pd_bodies(
        BODY, prefill_host="h", bootstrap_port=1, pair_id="x", attempt=1, request_id="x#a1"
    )
    p2, _ = sglang.pd_bodies(
        BODY, prefill_host="h", bootstrap_port=1, pair_id="x", attempt=2, request_id="x#a2"
    )
    assert p1["bootstrap_room"] != p2["bootstrap_room"]


def test_sglang_without_bootstrap_port_is_refused() -> None:
    with pytest.raises(sglang.BootstrapError, match="bootstrap_port"):
        sglang.pd_bodies(BODY, prefill_host="h", bootstrap_port=None, pair_id="x", attempt=1, request_id="x")


@pytest.mark.parametrize("capability", sorted(REGISTRY))
def test_every_adapter_honours_the_interface(capability: str) -> None:
    adapter = REGISTRY[capability]
    assert adapter.capability == capability
    assert adapter_for(capability) is adapter
    # A capability a node agent can register, and native paths the coordinator routes.
    profile, _none = get_args(EngineSection.model_fields["dispatch_profile"].annotation)
    assert capability in get_args(profile)
    assert adapter.native_paths <= set(ROUTES)
    assert inspect.iscoroutinefunction(adapter.run)


@pytest.mark.parametrize("capability", [None, "trigger", "", "HANDOFF"])
def test_a_protocol_without_an_adapter_has_none(capability: str | None) -> None:
    assert adapter_for(capability) is None


@pytest.mark.parametrize(
    ("path", "capabilities"),
    [
        (b"/generate", ("bootstrap",)),  # SGLang's native route: bootstrap fields, no max_tokens rewrite
        (b"/v1/score", ()),
        (b"/tokenize", ()),
        (b"/v1/chat/completions", ()),  # /v1 runs every adapter; this lists the extra paths only
    ],
)
def test_which_adapters_split_a_native_route(path: bytes, capabilities: tuple[str, ...]) -> None:
    assert splitting(path) == capabilities
    if path in ROUTES and ROUTES[path].native:
        assert ROUTES[path].serves.pd == capabilities
