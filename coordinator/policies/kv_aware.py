"""kv_aware: the endpoint whose KV cache already holds most of the prompt, weighed against load.

What each engine holds comes from the engines themselves: their KV events, compacted by
their node agents into the `motor_kvview` bucket and folded by every coordinator replica into
the same `core.kvblocks.KvView` (so a new replica is not cache-blind and two replicas agree).
The prompt's blocks are named the way the view names them, by the chain over token ids
(`core.kvblocks.prompt_chain`) of the prompt as the engine tokenizes it (`core.kvprompt`).

Each candidate costs the prompt tokens it would have to compute (those past its cached
prefix) plus `load_tokens` for every request it has running, waiting or in flight from us;
the cheapest wins, ties rotate. An endpoint loaded past `load_factor` × the mean (plus
`slack`) gets no credit for its cache, so a hot prefix spills over instead of drowning one
engine. A prompt the coordinator cannot tokenize is routed by load alone: for the builtin
engine every prompt can be, for other engines only a prompt given as token ids (their
tokenizers are not in the coordinator).

Between a pick and the view showing its blocks (the engine's event, the agent's next write,
the fold: a few hundred ms) the policy counts the prompt's blocks on the chosen endpoint as
cached (`_recent`, bounded), so a burst sharing a new prefix follows its first request instead
of scattering; an entry counts only while the endpoint's view is the one it was made under:
the engine's own word replaces this replica's guess at its next update. As a decode
policy it scores the decode engines' caches: what a P/D pair's decode holds it need not
fetch again.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from typing import Any

from coordinator.policies.base import RequestInfo, allowed
from coordinator.policies.least_load import LeastLoad
from coordinator.table import Endpoint
from core.kvblocks import EndpointView, KvView, prompt_chain
from core.kvprompt import builtin_prompt_ids, given_token_ids

PromptIds = Callable[[dict[str, Any]], list[int] | None]


class KvAware:
    """Fewest tokens to compute plus a price per queued request; least load without a prompt."""

    name = "kv_aware"
    uses_prefix = False  # it reads the body itself

    def __init__(
        self,
        view: KvView,
        prompt_ids: PromptIds = builtin_prompt_ids,
        *,
        load_tokens: float = 64.0,
        load_factor: float = 1.25,
        slack: int = 2,
        recent: int = 65536,
    ) -> None:
        if load_tokens < 0 or load_factor < 1 or slack < 0:
            raise ValueError("kv_aware needs load_tokens >= 0, load_factor >= 1 and slack >= 0")
        self.view = view
        self.prompt_ids = prompt_ids
        self.load_tokens = load_tokens
        self.load_factor = load_factor
        self.slack = slack
        self._fallback = LeastLoad()
        self._start = 0
        self._recent_cap = recent
        # chain → (endpoint key, its view when we sent the prompt there)
        self._recent: OrderedDict[int, tuple[str, EndpointView]] = OrderedDict()
        self.hits = 0  # requests sent where some of the prompt was cached
        self.misses = 0

    def bound(self, endpoints: Sequence[Endpoint]) -> int:
        """The highest load at which an endpoint's cache still counts."""
        total = sum(e.load for e in endpoints)
        return math.ceil(self.load_factor * (total + 1) / max(1, len(endpoints))) + self.slack

    def matched_blocks(
        self, endpoint: Endpoint, ids: Sequence[int], memo: dict[int, list[int]]
    ) -> tuple[int, int]:
        """(cached prefix blocks, block size) of the prompt on `endpoint` (0, 0 without a view)."""
        v = self.view.get(endpoint.key)
        if v is None or v.block_size <= 0:
            return 0, 0
        chains = memo.get(v.block_size)
        if chains is None:
            chains = memo[v.block_size] = prompt_chain(ids, v.block_size)
        n = v.cached_prefix(chains)
        recent = self._recent
        key = endpoint.key
        while n < len(chains):
            guess = recent.get(chains[n])
            if guess is None or guess[0] != key or guess[1] is not v:
                break
            n += 1
        return n, v.block_size

    def _remember(self, endpoint: Endpoint, ids: Sequence[int], memo: dict[int, list[int]]) -> None:
        """Count the prompt's blocks on `endpoint` until its view is updated."""
        v = self.view.get(endpoint.key)
        if v is None or v.block_size <= 0:
            return
        chains = memo.get(v.block_size)
        if chains is None:
            chains = memo[v.block_size] = prompt_chain(ids, v.block_size)
        recent = self._recent
        entry = (endpoint.key, v)
        for c in chains:
            if c not in v.blocks:
                recent[c] = entry
                recent.move_to_end(c)
        while len(recent) > self._recent_cap:
            recent.popitem(last=False)

    def select(
        self, endpoints: Sequence[Endpoint], req: RequestInfo, exclude: Collection[str] = ()
    ) -> Endpoint | None:
        """The endpoint that would compute the least, counting its queue."""
        eps = allowed(endpoints, exclude)
        n = len(eps)
        if n == 0:
            return None
        ids = None
        if req.body is not None and len(self.view):
            # Candidates of one model share an engine type (plan.py).
            ids = self.prompt_ids(req.body) if eps[0].engine_type == "builtin" else given_token_ids(req.body)
        if not ids:
            return self._fallback.select(eps, req)
        limit = self.bound(eps)
        memo: dict[int, list[int]] = {}
        start = self._start % n
        self._start = start + 1
        best: Endpoint | None = None
        best_cost = 0.0
        best_cached = 0
        for i in range(n):
            e = eps[(start + i) % n]
            load = e.load
            cached = 0
            if load < limit:
                blocks, size = self.matched_blocks(e, ids, memo)
                cached = min(blocks * size, len(ids))
            cost = (len(ids) - cached) + self.load_tokens * load
            if best is None or cost < best_cost:
                best, best_cost, best_cached = e, cost, cached
        if best_cached:
            self.hits += 1
        else:
            self.misses += 1
        if best is not None:
            self._remember(best, ids, memo)
        return best
