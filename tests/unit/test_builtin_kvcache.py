"""The builtin engine's KV block pool: prefix caching by block hash, LRU eviction, exhaustion."""

from __future__ import annotations

import pytest

from simengine.kvcache import BlockPool, block_hashes


def toks(n: int, base: str = "t") -> list[str]:
    return [f"{base}{i}" for i in range(n)]


@pytest.mark.parametrize(("n", "full_blocks"), [(0, 0), (3, 0), (4, 1), (7, 1), (8, 2), (9, 2)])
def test_only_full_blocks_are_hashed(n: int, full_blocks: int) -> None:
    assert len(block_hashes(toks(n), 4)) == full_blocks


def test_hashes_chain_so_a_block_depends_on_its_prefix() -> None:
    a = block_hashes(["x", "y", "a", "b"], 2)
    b = block_hashes(["z", "y", "a", "b"], 2)
    assert a[1] != b[1]  # same tokens in block 2, different prefix
    assert block_hashes(["x", "y", "a", "b", "c", "d"], 2)[:2] == a


def test_shared_prefix_is_a_cache_hit_after_free() -> None:
    pool = BlockPool(16, 4)
    prompt = toks(10)
    first = pool.allocate(block_hashes(prompt, 4), 12)
    assert first is not None and first.cached_blocks == 0 and len(first.blocks) == 3
    pool.free(first)
    assert pool.used == 0
    second = pool.allocate(block_hashes(prompt, 4), 12)
    assert second is not None and second.cached_blocks == 2
    assert second.blocks[:2] == first.blocks[:2]


def test_concurrent_requests_share_cached_blocks() -> None:
    pool = BlockPool(16, 4)
    prompt = toks(8)
    a = pool.allocate(block_hashes(prompt, 4), 9)
    b = pool.allocate(block_hashes(prompt, 4), 9)
    assert a is not None and b is not None
    assert b.cached_blocks == 2 and b.blocks[:2] == a.blocks[:2]
    assert pool.used == 4  # 2 shared + 1 private each


def test_allocation_fails_when_blocks_run_out_and_succeeds_after_free() -> None:
    pool = BlockPool(4, 4)
    a = pool.allocate([], 12)
    assert a is not None
    assert pool.allocate([], 8) is None
    pool.free(a)
    assert pool.allocate([], 8) is not None


def test_cached_unreferenced_blocks_are_evicted_lru_first() -> None:
    pool = BlockPool(4, 2)
    old = pool.allocate(block_hashes(["a", "b"], 2), 2)
    new = pool.allocate(block_hashes(["c", "d"], 2), 2)
    assert old is not None and new is not None
    pool.free(old)
    pool.free(new)
    # Needs 3 fresh blocks: 2 free ones, then the least recently freed cached block ("a b").
    big = pool.allocate([], 6)
    assert big is not None
    assert pool.cached_prefix(block_hashes(["a", "b"], 2)) == 0
    assert pool.cached_prefix(block_hashes(["c", "d"], 2)) == 1


def test_hit_blocks_are_not_counted_as_reclaimable() -> None:
    pool = BlockPool(3, 2)
    a = pool.allocate(block_hashes(["a", "b"], 2), 2)
    assert a is not None
    pool.free(a)
    # 1 hit (evictable) + needs 2 fresh: only 2 free remain, so it fits exactly.
    b = pool.allocate(block_hashes(["a", "b"], 2), 6)
    assert b is not None and b.cached_blocks == 1 and pool.used == 3


def test_usage_and_double_free() -> None:
    pool = BlockPool(10, 1)
    a = pool.allocate([], 5)
    assert a is not None and pool.usage() == 0.5
    pool.free(a)
    pool.free(a)
    assert pool.usage() == 0.0


def test_reset_cache_forgets_unreferenced_prefixes() -> None:
    pool = BlockPool(4, 2)
    a = pool.allocate(block_hashes(["a", "b"], 2), 2)
    assert a is not None
    pool.free(a)
    pool.reset_cache()
    assert pool.cached_prefix(block_hashes(["a", "b"], 2)) == 0
    assert pool.allocate([], 8) is not None


def test_pool_tells_what_it_caches_as_vllm_does() -> None:
    """BlockStored with token ids and the previous block's hash, BlockRemoved on eviction,
    AllBlocksCleared on a reset; folded the node agent's way, they name the prompt's chain."""
    from core.kvblocks import EndpointBlocks, prompt_chain
    from core.kvwire import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
    from simengine.tokenizer import token_ids

    events: list[KvEvent] = []
    pool = BlockPool(num_blocks=4, block_size=2)
    pool.listener = events.append
    a = ["x", "y", "z", "w"]
    alloc = pool.allocate(block_hashes(a, 2), 4, a)
    assert alloc is not None
    (ev,) = events
    assert isinstance(ev, BlockStored) and ev.parent is None and len(ev.block_hashes) == 2
    b = [*a, "v", "u"]  # shares a's two blocks, adds one
    pool.free(alloc)
    alloc_b = pool.allocate(block_hashes(b, 2), 6, b)
    assert alloc_b is not None and alloc_b.cached_blocks == 2
    new = events[1]
    assert isinstance(new, BlockStored) and new.parent == ev.block_hashes[-1]
    folded = EndpointBlocks()
    folded.apply_all(events)
    assert folded.chains() == prompt_chain(token_ids(b), 2)
    pool.free(alloc_b)
    c = ["p", "q", "r", "s"]  # needs two blocks: one free, one evicted (a's first, LRU)
    assert pool.allocate(block_hashes(c, 2), 4, c) is not None
    assert any(isinstance(e, BlockRemoved) for e in events)
    pool.reset_cache()
    assert isinstance(events[-1], AllBlocksCleared)
