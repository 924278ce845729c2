"""prefix_affinity: requests sharing a prompt prefix go where that prefix's KV cache already is.

The prompt's first bytes are hashed at doubling boundaries (256, 512, 1024, … bytes, and the
prompt's end): a handful of hashes cover a long shared system prompt, and routing only needs
"which endpoint has seen the longest part of this", not token precision. A bounded LRU maps
prefix hashes to the endpoint that served them last. A request goes to the endpoint of its
longest remembered prefix unless that endpoint is over the load bound (consistent hashing
with bounded loads: at most `load_factor` × the mean load, plus `slack`); then the next
shorter prefix is tried, and finally the least loaded endpoint. So a hot prefix spills over
instead of drowning one engine.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Collection, Sequence

from coordinator.policies.base import PREFIX_LIMIT, RequestInfo
from coordinator.policies.least_load import LeastLoad
from coordinator.table import Endpoint

_LOW48 = (1 << 48) - 1


def block_hashes(prefix: bytes, first_block: int = 256, max_bytes: int = PREFIX_LIMIT) -> list[int]:
    """Hashes of the prompt's prefixes at doubling boundaries; element i names bytes [0, boundary_i).

    Each value hashes the whole prefix up to its boundary (the doubling keeps the total
    hashed at most twice the prompt), with the boundary in the top bits. Python's bytes hash
    is per-process salted, which suits a memory that lives in this process only; a collision
    only costs a suboptimal placement, never a wrong answer.
    """
    out: list[int] = []
    end = min(len(prefix), max_bytes)
    stop = first_block
    while stop < end:
        out.append((stop << 48) | (hash(prefix[:stop]) & _LOW48))
        stop *= 2
    if end:
        out.append((end << 48) | (hash(prefix[:end]) & _LOW48))
    return out


class PrefixAffinity:
    """Longest remembered prefix wins, within a load bound; least load otherwise."""

    name = "prefix_affinity"
    uses_prefix = True

    def __init__(
        self,
        *,
        first_block: int = 256,
        max_bytes: int = PREFIX_LIMIT,
        capacity: int = 65536,
        load_factor: float = 1.25,
        slack: int = 2,
    ) -> None:
        if first_block < 1 or max_bytes < 1 or capacity < 1 or load_factor < 1:
            raise ValueError(
                "prefix_affinity needs first_block, max_bytes, capacity >= 1 and load_factor >= 1"
            )
        self.first_block = first_block
        self.max_bytes = max_bytes
        self.capacity = capacity
        self.load_factor = load_factor
        self.slack = slack
        self._lru: OrderedDict[int, str] = OrderedDict()
        self._fallback = LeastLoad()
        self.hits = 0
        self.misses = 0

    def __len__(self) -> int:
        return len(self._lru)

    def bound(self, endpoints: Sequence[Endpoint]) -> int:
        """The highest load an endpoint may have and still take an affine request."""
        total = sum(e.running + e.waiting + e.inflight for e in endpoints)
        return math.ceil(self.load_factor * (total + 1) / max(1, len(endpoints))) + self.slack

    def select(
        self, endpoints: Sequence[Endpoint], req: RequestInfo, exclude: Collection[str] = ()
    ) -> Endpoint | None:
        """The endpoint holding the longest cached prefix of the prompt, if not overloaded."""
        eps = [e for e in endpoints if e.key not in exclude] if exclude else endpoints
        if not eps:
            return None
        hashes = block_hashes(req.prefix, self.first_block, self.max_bytes)
        lru = self._lru
        chosen: Endpoint | None = None
        matched = -1  # index of the longest remembered block that was used
        if hashes and lru:
            by_key: dict[str, Endpoint] | None = None
            limit = 0
            for i in range(len(hashes) - 1, -1, -1):
                key = lru.get(hashes[i])
                if key is None:
                    continue
                if by_key is None:  # built only when some prefix is remembered
                    by_key = {e.key: e for e in eps}
                    limit = self.bound(eps)
                e = by_key.get(key)
                if e is not None and e.running + e.waiting + e.inflight < limit:
                    chosen, matched = e, i
                    break
        if chosen is None:
            self.misses += 1
            chosen = self._fallback.select(eps, req)
            if chosen is None:
                return None
        else:
            self.hits += 1
        self._remember(hashes, matched, chosen.key)
        return chosen

    def _remember(self, hashes: list[int], matched: int, key: str) -> None:
        """Map the prompt's blocks to `key`; on a hit, blocks up to `matched` already are."""
        lru = self._lru
        if matched >= 0:
            # The shorter blocks were stored with it; refreshing the longest keeps the match.
            lru.move_to_end(hashes[matched])
        for h in hashes[matched + 1 :]:
            lru[h] = key
            lru.move_to_end(h)
        while len(lru) > self.capacity:
            lru.popitem(last=False)
