"""Chain names of KV blocks, the node agent's compaction and the coordinator's fold (core.kvblocks)."""

from __future__ import annotations

import pytest

from core import subjects
from core.kvblocks import EndpointBlocks, KvView, chain, decode_view, encode_view, prompt_chain
from core.kvprompt import builtin_prompt_ids
from core.kvwire import AllBlocksCleared, BlockRemoved, BlockStored

TOKENS = tuple(range(100, 112))  # three blocks of 4


def test_prompt_chain_names_full_blocks_only_and_is_stable() -> None:
    c = prompt_chain((*TOKENS, 1, 2), 4)
    assert len(c) == 3
    assert c[0] == chain(0, TOKENS[:4])
    assert c[1] == chain(c[0], TOKENS[4:8])
    assert prompt_chain((*TOKENS[:8], 9, 9, 9, 9), 4)[:2] == c[:2]  # a shared prefix shares names
    assert prompt_chain((*TOKENS[:8], 9, 9, 9, 9), 4)[2] != c[2]
    assert all(0 <= x < 2**63 for x in c)


def stored(hashes: tuple[int, ...], parent: int | None, tokens: tuple[int, ...]) -> BlockStored:
    return BlockStored(hashes, parent, tokens, 4)


# (events, the prompt chain indexes the view then holds, orphans)
CASES = [
    ("one event for all blocks", [stored((1, 2, 3), None, TOKENS)], [0, 1, 2], 0),
    (
        "blocks stored over two events, chained by the engine's parent hash",
        [stored((1,), None, TOKENS[:4]), stored((2, 3), 1, TOKENS[4:])],
        [0, 1, 2],
        0,
    ),
    ("an eviction", [stored((1, 2, 3), None, TOKENS), BlockRemoved((3,))], [0, 1], 0),
    (
        "a removal of an unknown hash is nothing",
        [stored((1,), None, TOKENS[:4]), BlockRemoved((99,))],
        [0],
        0,
    ),
    ("cleared", [stored((1, 2, 3), None, TOKENS), AllBlocksCleared()], [], 0),
    (
        "stored after a clear",
        [stored((1,), None, TOKENS[:4]), AllBlocksCleared(), stored((5,), None, TOKENS[:4])],
        [0],
        0,
    ),
    ("a parent we never saw: cannot be named", [stored((2, 3), 1, TOKENS[4:])], [], 1),
]


@pytest.mark.parametrize(("what", "events", "held", "orphans"), CASES, ids=[c[0] for c in CASES])
def test_compaction(what: str, events: list, held: list[int], orphans: int) -> None:
    eb = EndpointBlocks()
    eb.apply_all(events)
    names = prompt_chain(TOKENS, 4)
    assert sorted(eb.chains()) == sorted(names[i] for i in held)
    assert eb.orphans == orphans


def test_compaction_keeps_the_newest_within_its_cap() -> None:
    eb = EndpointBlocks(cap=2)
    eb.apply(stored((1, 2, 3), None, TOKENS))
    assert eb.chains() == prompt_chain(TOKENS, 4)[1:]


def test_view_round_trip_and_fold() -> None:
    names = prompt_chain(TOKENS, 4)
    view = KvView()
    view.apply("n1/0", encode_view(4, names[:2]))
    view.apply("n1/1", encode_view(4, names))
    v0, v1 = view.get("n1/0"), view.get("n1/1")
    assert v0 is not None and v1 is not None
    assert (v0.cached_prefix(names), v1.cached_prefix(names)) == (2, 3)
    view.apply("n1/0", None)
    assert view.get("n1/0") is None
    view.apply("n1/1", b"garbage")
    assert view.undecodable == 1 and view.get("n1/1") == v1  # a bad value leaves the last good one
    view.replace({"n2/0": encode_view(None, [])})
    assert view.keys() == ["n2/0"]
    assert decode_view(encode_view(None, [])).blocks == frozenset()


def test_view_keys_name_the_node_first() -> None:
    assert subjects.kv_view_key("node-1", 3) == "node-1.3"
    assert subjects.kv_view_endpoint("node-1.3") == "node-1/3"
    assert subjects.kv_view_endpoint("node-1") is None
    assert subjects.kv_view_endpoint("a.b.x") is None


def test_builtin_prompt_ids_follow_the_engines_template() -> None:
    chat = {"messages": [{"role": "user", "content": "hello there"}]}
    assert builtin_prompt_ids(chat) == builtin_prompt_ids(
        {"prompt": "<|user|>\nhello there\n<|assistant|>\n"}
    )
    assert builtin_prompt_ids({"prompt": [5, 6, 7]}) == [5, 6, 7]
    assert builtin_prompt_ids({"messages": "not a list"}) is None
    assert builtin_prompt_ids({}) is None
