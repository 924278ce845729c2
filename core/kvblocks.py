"""Motor's own name for a cached KV block, and the compacted view of what one engine holds.

An engine names its blocks with its own hash (vLLM: sha256 or a salted builtin hash over a
seed that changes per process unless PYTHONHASHSEED is fixed; the builtin engine: Python's
salted hash), which a coordinator cannot reproduce. So Motor names a block by a chain over
token ids that anyone can compute: `chain(parent, tokens)`, the parent being the previous
block's chain value (0 for the first block). The node agent re-derives it from each
`BlockStored`'s token ids and parent (`EndpointBlocks`); the coordinator computes it for a
prompt's token ids (`prompt_chain`). The two meet without any engine hash parity.

`EndpointBlocks` is the node agent's compaction of one engine's event stream into the set of
chain values it holds (the raw events are never forwarded); `encode_view`/`decode_view` are
the bytes of that set in the `motor_kvview` bucket; `KvView` is the coordinator's fold of the
bucket. Pure: no I/O, no clock.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgpack

from core.errors import DecodeError
from core.kvwire import AllBlocksCleared, BlockRemoved, BlockStored, EngineHash, KvEvent

VIEW_VERSION = 1
MAX_VIEW_BLOCKS = 65536  # 512 KiB of hashes: under NATS's default 1 MiB message
_MASK63 = (1 << 63) - 1


def chain(parent: int, tokens: Sequence[int]) -> int:
    """The chain value of a block of `tokens` after the block whose chain value is `parent`."""
    h = hashlib.blake2b(digest_size=8)
    h.update(struct.pack("<q", parent))
    h.update(struct.pack(f"<{len(tokens)}q", *tokens))
    return int.from_bytes(h.digest(), "little") & _MASK63


def prompt_chain(token_ids: Sequence[int], block_size: int, limit: int = MAX_VIEW_BLOCKS) -> list[int]:
    """Chain values of the prompt's full blocks (a partial last block is never cached)."""
    out: list[int] = []
    parent = 0
    stop = min(len(token_ids) // block_size, limit) * block_size
    for start in range(0, stop, block_size):
        parent = chain(parent, token_ids[start : start + block_size])
        out.append(parent)
    return out


class EndpointBlocks:
    """One engine's KV event stream compacted into the chain values of the blocks it holds.

    A `BlockStored` whose parent is unknown (stored before we listened, its events beyond the
    replay buffer) cannot be named and is counted in `orphans`; its blocks are simply not in
    the view, which costs a routing hint, never a wrong answer.
    """

    def __init__(self, cap: int = MAX_VIEW_BLOCKS) -> None:
        self.cap = cap
        self.block_size: int | None = None
        self.version = 0  # bumped on every change: the publisher sends when it moved
        self.orphans = 0
        self._chain: dict[EngineHash, int] = {}  # insertion order: newest last

    def __len__(self) -> int:
        return len(self._chain)

    def apply(self, ev: KvEvent) -> None:
        """Fold one event."""
        if isinstance(ev, BlockStored):
            self._stored(ev)
        elif isinstance(ev, BlockRemoved):
            for h in ev.block_hashes:
                if self._chain.pop(h, None) is not None:
                    self.version += 1
        elif isinstance(ev, AllBlocksCleared) and self._chain:
            self._chain.clear()
            self.version += 1

    def apply_all(self, events: Sequence[KvEvent]) -> None:
        """Fold events in order."""
        for ev in events:
            self.apply(ev)

    def _stored(self, ev: BlockStored) -> None:
        if ev.parent is None:
            parent = 0
        else:
            known = self._chain.get(ev.parent)
            if known is None:
                self.orphans += 1
                return
            parent = known
        self.block_size = ev.block_size
        bs = ev.block_size
        for i, eh in enumerate(ev.block_hashes):
            parent = chain(parent, ev.token_ids[i * bs : (i + 1) * bs])
            self._chain.pop(eh, None)
            self._chain[eh] = parent
        self.version += 1
        over = len(self._chain) - self.cap
        if over > 0:  # forget the oldest: the engine evicts LRU-first too
            for eh in list(self._chain)[:over]:
                del self._chain[eh]

    def chains(self) -> list[int]:
        """The chain values held, oldest first."""
        return list(self._chain.values())


@dataclass(frozen=True, slots=True)
class EndpointView:
    """What one engine holds, as the coordinator sees it."""

    block_size: int
    blocks: frozenset[int]

    def cached_prefix(self, chains: Sequence[int]) -> int:
        """How many leading blocks of a prompt's chain values this engine holds."""
        n = 0
        blocks = self.blocks
        for c in chains:
            if c not in blocks:
                break
            n += 1
        return n


def encode_view(block_size: int | None, chains: Sequence[int]) -> bytes:
    """The bucket value of one endpoint's view (block size 0: nothing stored yet)."""
    packed = struct.pack(f"<{len(chains)}q", *chains)
    return msgpack.packb({"v": VIEW_VERSION, "bs": block_size or 0, "h": packed}, use_bin_type=True)


def decode_view(value: bytes) -> EndpointView:
    """An endpoint's view from its bucket value; DecodeError when it is not one."""
    try:
        raw = msgpack.unpackb(value, raw=False)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise DecodeError(f"KV view is not msgpack: {exc}") from None
    if not isinstance(raw, dict) or raw.get("v") != VIEW_VERSION:
        raise DecodeError("KV view of an unknown shape or version")
    bs, packed = raw.get("bs"), raw.get("h")
    if not isinstance(bs, int) or bs < 0 or not isinstance(packed, bytes) or len(packed) % 8:
        raise DecodeError("KV view with a bad block size or hash list")
    n = len(packed) // 8
    return EndpointView(bs, frozenset(struct.unpack(f"<{n}q", packed)))


class KvView:
    """The coordinator's fold of the `motor_kvview` bucket: endpoint key → what it holds."""

    def __init__(self) -> None:
        self._views: dict[str, EndpointView] = {}
        self.version = 0
        self.undecodable = 0

    def __len__(self) -> int:
        return len(self._views)

    def get(self, endpoint_key: str) -> EndpointView | None:
        """The endpoint's view, None when it published none."""
        return self._views.get(endpoint_key)

    def apply(self, endpoint_key: str, value: bytes | None) -> None:
        """Fold one bucket entry: a value replaces the endpoint's view, None deletes it."""
        if value is None:
            if self._views.pop(endpoint_key, None) is not None:
                self.version += 1
            return
        try:
            view = decode_view(value)
        except DecodeError:
            self.undecodable += 1
            return
        self._views[endpoint_key] = view
        self.version += 1

    def replace(self, entries: Mapping[str, bytes]) -> None:
        """Fold a whole fresh read of the bucket: endpoints missing from it are gone."""
        for key in [k for k in self._views if k not in entries]:
            self.apply(key, None)
        for key, value in entries.items():
            self.apply(key, value)

    def keys(self) -> list[str]:
        """Endpoint keys with a view."""
        return sorted(self._views)

    def describe(self) -> list[dict[str, object]]:
        """Per endpoint: block size, block count and a digest of the blocks (for comparing replicas)."""
        out: list[dict[str, object]] = []
        for key in sorted(self._views):
            v = self._views[key]
            packed = struct.pack(f"<{len(v.blocks)}q", *sorted(v.blocks))
            digest = hashlib.blake2b(packed, digest_size=8).hexdigest()
            out.append(
                {"endpoint": key, "block_size": v.block_size, "blocks": len(v.blocks), "digest": digest}
            )
        return out
