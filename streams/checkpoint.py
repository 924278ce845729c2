"""Controller state checkpoints in KV: the state and the stream sequence it was folded to.

A restart loads the checkpoint and replays only the tail after `state.last_seq`. Values
are zlib-compressed JSON (`state_to_dict`), which keeps a large cluster's state well under
the server's max payload.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Any

import orjson

from core.state import ClusterState, state_from_dict, state_to_dict
from streams.definitions import CHECKPOINT_BUCKET
from streams.errors import CheckpointError, CorruptCheckpoint, StreamsError
from streams.log import BucketMissing, Log

FORMAT = 1
_KEY = re.compile(r"^[-/_=.a-zA-Z0-9]+$")


def _check_key(key: str) -> str:
    if not _KEY.match(key) or key.startswith(".") or key.endswith("."):
        raise CheckpointError(f"checkpoint key {key!r} is not a valid KV key (use A-Z a-z 0-9 - _ / = .)")
    return key


@dataclass(frozen=True, slots=True)
class Origin:
    """Which log a checkpoint was folded from, to tell later whether that log is still there."""

    stream_created: str | None = None  # the stream's `created` time (another after delete-and-recreate)
    event_ts: float | None = None  # `ts` of the last MOTOR event folded (purged while young?)


def encode_checkpoint(state: ClusterState, origin: Origin | None = None) -> bytes:
    """The stored form of a state."""
    body: dict[str, Any] = {"format": FORMAT, "seq": state.last_seq, "state": state_to_dict(state)}
    if origin is not None:
        body["stream_created"] = origin.stream_created
        body["event_ts"] = origin.event_ts
    return zlib.compress(orjson.dumps(body), 6)


def decode_checkpoint_origin(value: bytes) -> tuple[ClusterState, Origin]:
    """Inverse of `encode_checkpoint` (an old checkpoint has an empty origin)."""
    try:
        raw = orjson.loads(zlib.decompress(value))
        if raw.get("format") != FORMAT:
            raise CorruptCheckpoint(f"checkpoint format {raw.get('format')!r} is not {FORMAT}")
        ts = raw.get("event_ts")
        origin = Origin(raw.get("stream_created"), float(ts) if ts is not None else None)
        return state_from_dict(raw["state"]), origin
    except (zlib.error, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CorruptCheckpoint(f"unreadable checkpoint: {exc}") from None


async def save_checkpoint(log: Log, key: str, state: ClusterState, origin: Origin | None = None) -> None:
    """Store `state` (folded up to `state.last_seq`) under `key`."""
    value = encode_checkpoint(state, origin)
    try:
        await log.kv(CHECKPOINT_BUCKET).put(_check_key(key), value)
    except BucketMissing:
        raise CheckpointError(f"KV bucket {CHECKPOINT_BUCKET} missing (run ensure_streams)") from None
    except CheckpointError:
        raise
    except StreamsError as exc:
        raise CheckpointError(f"cannot save checkpoint {key!r} ({len(value)} bytes): {exc}") from None


async def load_checkpoint_origin(log: Log, key: str) -> tuple[ClusterState, Origin] | None:
    """The last checkpoint under `key` and the log it came from, or None if there is none
    (never saved, or deleted to force a full replay)."""
    try:
        entry = await log.kv(CHECKPOINT_BUCKET).get(_check_key(key))
    except BucketMissing:
        raise CheckpointError(f"KV bucket {CHECKPOINT_BUCKET} missing (run ensure_streams)") from None
    if entry is None:
        return None
    return decode_checkpoint_origin(entry.value)
