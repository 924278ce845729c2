"""kv_aware: cached prefix blocks from the folded KV view against load (a table per promise)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from coordinator.policies import KvAware, RequestInfo, make_policy
from coordinator.table import Endpoint
from core.events import Role
from core.kvblocks import KvView, encode_view, prompt_chain
from core.kvprompt import builtin_prompt_ids

BS = 16
SYSTEM = "You are a careful assistant who answers in full sentences. " * 60
BODY = {"model": "m", "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}]}
IDS = builtin_prompt_ids(BODY) or []
NAMES = prompt_chain(IDS, BS)


def eps(*loads: int) -> list[Endpoint]:
    return [
        Endpoint(
            key=f"n{i}/0",
            instance_id=i,
            role=Role.UNION,
            engine_type="builtin",
            model="m",
            host="127.0.0.1",
            port=9000 + i,
            bootstrap_port=None,
            capabilities=frozenset(),
            group=i,
            running=load,
        )
        for i, load in enumerate(loads)
    ]


def view(cached: dict[int, int]) -> KvView:
    """Endpoint i holds the first cached[i] blocks of the prompt."""
    v = KvView()
    for i, n in cached.items():
        v.apply(f"n{i}/0", encode_view(BS, NAMES[:n]))
    return v


def info(body: dict | None = BODY) -> RequestInfo:
    return RequestInfo("m", None, "r", body)


# (loads, blocks cached per endpoint, the winner, policy options)
CASES: list[tuple[str, tuple[int, ...], dict[int, int], int, dict[str, Any]]] = [
    ("cold everywhere: least loaded", (3, 0, 1), {}, 1, {}),
    ("the longest cached prefix wins at equal load", (1, 1, 1), {0: 3, 2: len(NAMES)}, 2, {}),
    ("the cache outweighs a little load", (0, 2, 0), {1: len(NAMES)}, 1, {}),
    ("a long queue outweighs the cache", (0, 12, 0), {1: len(NAMES)}, 0, {}),
    ("the same load past the bound gets no credit", (0, 4, 0, 0), {1: len(NAMES)}, 0, {"slack": 0}),
    ("... and within it keeps it", (0, 3, 0, 0), {1: len(NAMES)}, 1, {}),
    ("partial prefix beats none", (1, 1), {1: len(NAMES) // 2}, 1, {}),
    ("load_tokens 0: the cache alone decides", (0, 50), {1: 1}, 1, {"load_tokens": 0, "slack": 100}),
]


@pytest.mark.parametrize(("what", "loads", "cached", "winner", "opts"), CASES, ids=[c[0] for c in CASES])
def test_scoring(
    what: str, loads: tuple[int, ...], cached: dict[int, int], winner: int, opts: dict[str, Any]
) -> None:
    assert len(NAMES) > 30
    p = KvAware(view(cached), **opts)
    chosen = p.select(eps(*loads), info())
    assert chosen is not None and chosen.key == f"n{winner}/0"


def test_excluded_endpoints_are_skipped_even_when_cached() -> None:
    p = KvAware(view({0: len(NAMES)}))
    chosen = p.select(eps(0, 0), info(), exclude={"n0/0"})
    assert chosen is not None and chosen.key == "n1/0"
    assert p.select(eps(0), info(), exclude={"n0/0"}) is None


def test_without_a_prompt_or_a_view_it_is_least_load() -> None:
    assert KvAware(view({0: 5})).select(eps(4, 1), info(None)).key == "n1/0"  # type: ignore[union-attr]
    assert KvAware(KvView()).select(eps(4, 1), info()).key == "n1/0"  # type: ignore[union-attr]
    assert KvAware(view({0: 5})).select(eps(4, 1), info({"messages": 7})).key == "n1/0"  # type: ignore[union-attr]


def test_another_block_size_is_matched_in_its_own_blocks() -> None:
    v = KvView()
    v.apply("n1/0", encode_view(32, prompt_chain(IDS, 32)))
    assert KvAware(v).select(eps(1, 1), info()).key == "n1/0"  # type: ignore[union-attr]


def test_ties_rotate_without_the_memory_of_recent_picks() -> None:
    p = KvAware(view({0: 1, 1: 1}), recent=0)
    picks = {p.select(eps(0, 0), info()).key for _ in range(4)}  # type: ignore[union-attr]
    assert picks == {"n0/0", "n1/0"}


def test_registry_gives_it_the_view() -> None:
    v = view({1: len(NAMES)})
    p = make_policy("kv_aware", v)
    assert isinstance(p, KvAware) and p.view is v
    assert p.select(eps(0, 0), info()).key == "n1/0"  # type: ignore[union-attr]


def test_a_burst_follows_its_first_pick_until_the_view_catches_up() -> None:
    """Between a pick and the engine's own report, this replica counts the blocks as sent."""
    v = view({0: 0, 1: 0})
    p = KvAware(v)
    first = p.select(eps(0, 0), info())
    assert first is not None
    for _ in range(3):  # loads equal: without the memory the ties would rotate
        again = p.select(eps(0, 0), info())
        assert again is not None and again.key == first.key
    # The engine's report replaces the guess: now the other endpoint holds the prompt.
    other = "n1/0" if first.key == "n0/0" else "n0/0"
    v.apply(first.key, encode_view(BS, []))
    v.apply(other, encode_view(BS, NAMES))
    moved = p.select(eps(0, 0), info())
    assert moved is not None and moved.key == other


def test_other_engines_match_only_prompts_given_as_token_ids() -> None:
    """A text prompt tokenized the builtin way means nothing to vLLM's cache: load decides."""
    vllm = [replace(e, engine_type="vllm") for e in eps(1, 0)]
    v = KvView()
    v.apply("n0/0", encode_view(BS, NAMES))
    chosen = KvAware(v).select(vllm, info())
    assert chosen is not None and chosen.key == "n1/0"  # least loaded: the text was not matched
    chosen = KvAware(v).select(vllm, info({"model": "m", "prompt": IDS}))
    assert chosen is not None and chosen.key == "n0/0"  # token ids are matched on any engine
