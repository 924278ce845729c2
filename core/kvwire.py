"""The KV cache event wire protocol of vLLM (`--kv-events-config`) and SGLang, as data.

Written from the protocol, not from their code:

- A ZMQ PUB socket sends one batch a message in three frames: `topic` (bytes, may be empty),
  `seq` (8 bytes, big-endian; counts batches from 0) and `payload` (msgpack).
- The payload is a batch: `[ts, events]` or `[ts, events, data_parallel_rank]` (msgspec
  `array_like`, SGLang and older vLLM), or the map `{"ts", "events", "data_parallel_rank"}`
  (current vLLM). Each event is tagged with its class name: `["BlockStored", block_hashes,
  parent_block_hash, token_ids, block_size, lora_id, medium, …]` or `{"type": "BlockStored",
  "block_hashes": …}`; likewise `BlockRemoved` (`block_hashes`, `medium`) and
  `AllBlocksCleared`. Trailing fields with defaults may be left out; fields we do not use
  (LoRA, medium, extra keys, groups) are ignored. A block hash is an int or bytes.
- A ZMQ ROUTER replay socket answers a request `[b"", start_seq (8 bytes, big-endian)]` with
  every batch it still buffers from `start_seq` on, then an end marker whose sequence frame is
  -1 (8 signed bytes) with an empty payload. vLLM 0.32 (what tests/real runs) sends each as
  `[b"", topic, seq, payload]`, end `[b"", b"", -1, b""]`; its earlier publisher (and SGLang's)
  as `[b"", seq, payload]`, end `[b"", -1, b""]`. Both are read (`decode_replay`).

Pure: bytes in, frozen values out (msgpack is a codec, no I/O).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from core.errors import DecodeError

EngineHash = int | bytes  # an engine's own block hash (vLLM: int or a sha256 digest)
END_SEQ = -1  # the replay socket's end-of-replay marker
SEQ_BYTES = 8
_MAX_PAYLOAD = 16 * 1024 * 1024


class KvWireError(DecodeError):
    """Frames or a payload that are not a KV event batch."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks the engine now caches; `parent` is the hash of the block before the first."""

    block_hashes: tuple[EngineHash, ...]
    parent: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks the engine evicted."""

    block_hashes: tuple[EngineHash, ...]


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache (a reset, or a fresh process)."""


KvEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KvBatch:
    """One published message: its sequence number and its events, in order."""

    seq: int
    ts: float
    events: tuple[KvEvent, ...]
    dp_rank: int | None = None


def encode_seq(seq: int) -> bytes:
    """A sequence number as its 8-byte frame (END_SEQ as the signed end marker)."""
    return seq.to_bytes(SEQ_BYTES, "big", signed=seq < 0)


def decode_seq(frame: bytes) -> int:
    """An 8-byte sequence frame; the all-ones frame is END_SEQ."""
    if len(frame) != SEQ_BYTES:
        raise KvWireError(f"sequence frame of {len(frame)} bytes, want {SEQ_BYTES}")
    if frame == b"\xff" * SEQ_BYTES:
        return END_SEQ
    return int.from_bytes(frame, "big")


def _hash(value: Any, where: str) -> EngineHash:
    if isinstance(value, bool) or not isinstance(value, int | bytes):
        raise KvWireError(f"{where}: block hash must be an int or bytes, got {type(value).__name__}")
    return value


def _hashes(value: Any, where: str) -> tuple[EngineHash, ...]:
    if not isinstance(value, list | tuple):
        raise KvWireError(f"{where}: block_hashes must be a list")
    return tuple(_hash(v, where) for v in value)


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise KvWireError(f"{where} must be an int, got {type(value).__name__}")
    return value


_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size"),
    "BlockRemoved": ("block_hashes",),
    "AllBlocksCleared": (),
}


def _fields(raw: Any) -> tuple[str, dict[str, Any]]:
    """(tag, the fields we use) of an event in either shape."""
    if isinstance(raw, dict):
        tag = raw.get("type")
        if not isinstance(tag, str) or tag not in _FIELDS:
            raise KvWireError(f"unknown KV event {tag!r}")
        return tag, raw
    if isinstance(raw, list | tuple) and raw and isinstance(raw[0], str):
        tag = raw[0]
        names = _FIELDS.get(tag)
        if names is None:
            raise KvWireError(f"unknown KV event {tag!r}")
        return tag, dict(zip(names, raw[1:], strict=False))
    raise KvWireError(f"a KV event must be a tagged array or map, got {type(raw).__name__}")


def decode_event(raw: Any) -> KvEvent:
    """One event of a batch."""
    tag, f = _fields(raw)
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    if "block_hashes" not in f:
        raise KvWireError(f"{tag} without block_hashes")
    hashes = _hashes(f["block_hashes"], tag)
    if tag == "BlockRemoved":
        return BlockRemoved(hashes)
    for name in ("token_ids", "block_size"):
        if name not in f:
            raise KvWireError(f"BlockStored without {name}")
    parent = f.get("parent_block_hash")
    tokens = f["token_ids"]
    if not isinstance(tokens, list | tuple):
        raise KvWireError("BlockStored.token_ids must be a list")
    size = _int(f["block_size"], "BlockStored.block_size")
    if size < 1 or len(tokens) != size * len(hashes):
        raise KvWireError(f"BlockStored: {len(tokens)} token ids for {len(hashes)} blocks of {size} tokens")
    return BlockStored(
        hashes,
        None if parent is None else _hash(parent, "BlockStored.parent_block_hash"),
        tuple(_int(t, "BlockStored.token_ids[]") for t in tokens),
        size,
    )


def decode_payload(seq: int, payload: bytes) -> KvBatch:
    """A batch's msgpack payload (either shape)."""
    if len(payload) > _MAX_PAYLOAD:
        raise KvWireError(f"payload of {len(payload)} bytes")
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise KvWireError(f"payload is not msgpack: {exc}") from None
    if isinstance(raw, dict):
        ts, events, rank = raw.get("ts"), raw.get("events"), raw.get("data_parallel_rank")
    elif isinstance(raw, list | tuple) and len(raw) in (2, 3):
        ts, events = raw[0], raw[1]
        rank = raw[2] if len(raw) == 3 else None
    else:
        raise KvWireError(f"a batch must be [ts, events, rank?] or a map, got {type(raw).__name__}")
    if isinstance(ts, bool) or not isinstance(ts, int | float):
        raise KvWireError("batch ts must be a number")
    if not isinstance(events, list | tuple):
        raise KvWireError("batch events must be a list")
    if rank is not None:
        rank = _int(rank, "data_parallel_rank")
    return KvBatch(seq, float(ts), tuple(decode_event(e) for e in events), rank)


def decode_frames(frames: Sequence[bytes]) -> KvBatch:
    """A PUB message `[topic, seq, payload]`."""
    if len(frames) != 3:
        raise KvWireError(f"{len(frames)} frames, want 3 (topic, seq, payload)")
    seq = decode_seq(frames[1])
    if seq == END_SEQ:
        raise KvWireError("end-of-replay marker on the PUB socket")
    return decode_payload(seq, frames[2])


def decode_replay(frames: Sequence[bytes]) -> KvBatch | None:
    """One message from the replay socket, as a DEALER receives it; None for the end marker."""
    if len(frames) == 4 and frames[0] == b"":
        seq_frame, payload = frames[2], frames[3]
    elif len(frames) == 3 and frames[0] == b"":
        seq_frame, payload = frames[1], frames[2]
    else:
        raise KvWireError(f"replay message of {len(frames)} frames, want [b'', topic?, seq, payload]")
    seq = decode_seq(seq_frame)
    if seq == END_SEQ:
        return None
    return decode_payload(seq, payload)


def encode_event(ev: KvEvent) -> dict[str, Any]:
    """An event in current vLLM's map shape."""
    if isinstance(ev, BlockStored):
        return {
            "type": "BlockStored",
            "block_hashes": list(ev.block_hashes),
            "parent_block_hash": ev.parent,
            "token_ids": list(ev.token_ids),
            "block_size": ev.block_size,
            "lora_id": None,
            "medium": "GPU",
            "lora_name": None,
        }
    if isinstance(ev, BlockRemoved):
        return {"type": "BlockRemoved", "block_hashes": list(ev.block_hashes), "medium": "GPU"}
    return {"type": "AllBlocksCleared"}


def encode_payload(ts: float, events: Sequence[KvEvent], dp_rank: int = 0) -> bytes:
    """A batch's msgpack payload in current vLLM's map shape."""
    body = {"ts": ts, "events": [encode_event(e) for e in events], "data_parallel_rank": dp_rank}
    return msgpack.packb(body, use_bin_type=True)


def replay_request(start_seq: int) -> list[bytes]:
    """What a DEALER sends the replay socket to get every batch from `start_seq` on."""
    return [b"", encode_seq(start_seq)]
