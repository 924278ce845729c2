"""A paged KV cache with prefix caching by block hash, like vLLM's block pool.

Full prompt blocks are named by a chained hash (the block's tokens and its parent's hash), so
two prompts sharing a prefix share blocks. Freed blocks that carry a hash stay cached until
their space is needed (LRU eviction). Pure bookkeeping: no I/O, no clock.

With a `listener` the pool tells what it caches the way vLLM's block pool does
(`core.kvwire`): `BlockStored` when full prompt blocks get a hash (with their token ids and
the previous block's hash), `BlockRemoved` when a cached block is evicted, `AllBlocksCleared`
on a reset. `simengine.kvpublish` sends them over vLLM's ZMQ protocol.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from core.kvwire import AllBlocksCleared, BlockRemoved, BlockStored, KvEvent
from simengine.tokenizer import Token, token_ids


@dataclass(slots=True)
class Allocation:
    """Blocks held by one request; `cached_blocks` of them were prefix-cache hits."""

    blocks: list[int]
    cached_blocks: int
    freed: bool = False


def block_hashes(tokens: Sequence[Token], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of `tokens` (a partial last block has none)."""
    out: list[int] = []
    parent = 0
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[start : start + block_size])))
        out.append(parent)
    return out


class BlockPool:
    """`num_blocks` blocks of `block_size` tokens, with reference counts and a prefix cache."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._refs = [0] * num_blocks
        self._hash_of: dict[int, int] = {}
        self._by_hash: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced; LRU first
        self.used = 0  # blocks with a reference
        self.listener: Callable[[KvEvent], None] | None = None

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def cached_prefix(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of `hashes` are in the cache now."""
        n = 0
        for h in hashes:
            if h not in self._by_hash:
                break
            n += 1
        return n

    def allocate(
        self, hashes: Sequence[int], num_tokens: int, tokens: Sequence[Token] | None = None
    ) -> Allocation | None:
        """Reserve blocks for `num_tokens` tokens whose full prompt blocks are `hashes`.

        Returns None when the blocks are not there now (the caller waits and retries).
        `tokens` (the prompt's) are what a listener is told the new blocks hold.
        """
        needed = self.blocks_for(num_tokens)
        hit = self.cached_prefix(hashes)
        hit_blocks = [self._by_hash[h] for h in hashes[:hit]]
        if needed - hit > len(self._free):
            # Cached blocks this request is about to reuse cannot also be evicted for it.
            reclaimable = len(self._free) + len(self._evictable)
            reclaimable -= sum(1 for b in hit_blocks if b in self._evictable)
            if needed - hit > reclaimable:
                return None
        for b in hit_blocks:
            self._ref(b)
        blocks = hit_blocks
        stored: list[int] = []  # indexes of the prompt blocks cached now
        for i in range(hit, needed):
            b = self._take()
            self._refs[b] = 1
            self.used += 1
            if i < len(hashes) and hashes[i] not in self._by_hash:
                self._hash_of[b] = hashes[i]
                self._by_hash[hashes[i]] = b
                stored.append(i)
            blocks.append(b)
        if stored and self.listener is not None and tokens is not None:
            self._tell_stored(hashes, stored, tokens)
        return Allocation(blocks, hit)

    def _tell_stored(self, hashes: Sequence[int], stored: list[int], tokens: Sequence[Token]) -> None:
        """One BlockStored a run of consecutive new blocks, as vLLM groups them."""
        assert self.listener is not None
        bs = self.block_size
        run: list[int] = []
        for i in [*stored, -1]:
            if run and i != run[-1] + 1:
                first = run[0]
                self.listener(
                    BlockStored(
                        tuple(hashes[j] for j in run),
                        hashes[first - 1] if first > 0 else None,
                        tuple(token_ids(tokens[first * bs : (run[-1] + 1) * bs])),
                        bs,
                    )
                )
                run = []
            run.append(i)

    def free(self, alloc: Allocation) -> None:
        """Release a request's blocks; hashed ones stay cached for later prompts."""
        if alloc.freed:
            return
        alloc.freed = True
        for b in alloc.blocks:
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self.used -= 1
                if b in self._hash_of:
                    self._evictable[b] = None
                else:
                    self._free.append(b)

    def cached_blocks(self) -> int:
        """Blocks whose prefix is cached (held by a request or evictable)."""
        return len(self._by_hash)

    def usage(self) -> float:
        """Fraction of blocks referenced by running requests (0..1)."""
        return self.used / self.num_blocks

    def reset_cache(self) -> None:
        """Forget every cached prefix that no request holds (SGLang's flush_cache)."""
        for b in self._evictable:
            del self._by_hash[self._hash_of.pop(b)]
            self._free.append(b)
        self._evictable.clear()
        if self.listener is not None:
            # Blocks running requests hold keep their hashes (a later prompt may still hit
            # them) but leave the published view: a routing hint lost, nothing wrong.
            self.listener(AllBlocksCleared())

    def _ref(self, b: int) -> None:
        if self._refs[b] == 0:
            self._evictable.pop(b, None)
            self.used += 1
        self._refs[b] += 1

    def _take(self) -> int:
        if self._free:
            return self._free.pop()
        b, _ = self._evictable.popitem(last=False)
        h = self._hash_of.pop(b)
        del self._by_hash[h]
        if self.listener is not None:
            self.listener(BlockRemoved((h,)))
        return b
