"""The KV event wire protocol (core.kvwire): both of vLLM's shapes, SGLang's, and bad input."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from core.kvwire import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KvWireError,
    decode_frames,
    decode_payload,
    decode_replay,
    decode_seq,
    encode_payload,
    encode_seq,
    replay_request,
)

STORED = BlockStored((11, 12), None, tuple(range(8)), 4)


def pack(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


# Shapes as the engines' msgspec encoders lay them out (array_like: SGLang and vLLM <= 0.11;
# maps with a "type" tag: current vLLM), with fields we ignore and trailing defaults omitted.
CASES: list[tuple[str, Any, tuple[Any, ...]]] = [
    (
        "array batch, array events (SGLang, older vLLM)",
        [1.5, [["BlockStored", [11, 12], None, list(range(8)), 4, None], ["BlockRemoved", [11]]]],
        (STORED, BlockRemoved((11,))),
    ),
    (
        "array batch with dp rank, medium and lora fields",
        [
            1.5,
            [["BlockStored", [11, 12], None, list(range(8)), 4, None, "GPU", None], ["AllBlocksCleared"]],
            0,
        ],
        (STORED, AllBlocksCleared()),
    ),
    (
        "map batch, map events (current vLLM), extra keys and groups ignored",
        {
            "ts": 2.0,
            "events": [
                {
                    "type": "BlockStored",
                    "block_hashes": [11, 12],
                    "parent_block_hash": None,
                    "token_ids": list(range(8)),
                    "block_size": 4,
                    "lora_id": None,
                    "medium": "GPU",
                    "lora_name": None,
                    "extra_keys": [None, None],
                    "group_idx": 0,
                },
                {"type": "BlockRemoved", "block_hashes": [12], "medium": "GPU"},
                {"type": "AllBlocksCleared"},
            ],
            "data_parallel_rank": 1,
        },
        (STORED, BlockRemoved((12,)), AllBlocksCleared()),
    ),
    (
        "bytes hashes (vLLM's sha256 block hashes)",
        [0.0, [["BlockStored", [b"\x01" * 32], b"\x02" * 32, [5, 6], 2]]],
        (BlockStored((b"\x01" * 32,), b"\x02" * 32, (5, 6), 2),),
    ),
]


@pytest.mark.parametrize(("what", "raw", "events"), CASES, ids=[c[0] for c in CASES])
def test_decodes_every_shape(what: str, raw: Any, events: tuple[Any, ...]) -> None:
    batch = decode_frames([b"kv", encode_seq(7), pack(raw)])
    assert batch.seq == 7
    assert batch.events == events


BAD: list[tuple[str, list[bytes]]] = [
    ("two frames", [b"", encode_seq(0)]),
    ("short seq frame", [b"", b"\x00\x01", pack([0.0, []])]),
    ("not msgpack", [b"", encode_seq(0), b"\xc1\xc1\xc1"]),
    ("batch is a string", [b"", encode_seq(0), pack("hello")]),
    ("events not a list", [b"", encode_seq(0), pack([0.0, 5])]),
    ("unknown event tag", [b"", encode_seq(0), pack([0.0, [["BlockMoved", [1]]]])]),
    ("event is a number", [b"", encode_seq(0), pack([0.0, [42]])]),
    ("token count wrong", [b"", encode_seq(0), pack([0.0, [["BlockStored", [1], None, [1, 2, 3], 4]]])]),
    ("hash is a float", [b"", encode_seq(0), pack([0.0, [["BlockRemoved", [1.5]]]])]),
    ("token is a string", [b"", encode_seq(0), pack([0.0, [["BlockStored", [1], None, ["a"], 1]]])]),
    ("missing block size", [b"", encode_seq(0), pack([0.0, [{"type": "BlockStored", "block_hashes": [1]}]])]),
    ("end marker on PUB", [b"", encode_seq(END_SEQ), b""]),
]


@pytest.mark.parametrize(("what", "frames"), BAD, ids=[b[0] for b in BAD])
def test_malformed_frames_raise_one_error_type(what: str, frames: list[bytes]) -> None:
    with pytest.raises(KvWireError):
        decode_frames(frames)


def test_sequence_frames_and_the_end_marker() -> None:
    assert encode_seq(1) == b"\x00" * 7 + b"\x01"
    assert encode_seq(END_SEQ) == b"\xff" * 8
    assert decode_seq(encode_seq(2**40)) == 2**40
    assert decode_seq(b"\xff" * 8) == END_SEQ
    assert replay_request(5) == [b"", encode_seq(5)]


def test_our_encoding_decodes_to_the_same_events() -> None:
    events = (STORED, BlockRemoved((11,)), AllBlocksCleared())
    assert decode_payload(3, encode_payload(1.0, events)).events == events


@pytest.mark.parametrize(
    ("what", "frames", "seq"),
    [
        ("vLLM 0.32: topic with each batch", [b"", b"kv", encode_seq(4), encode_payload(0.0, [STORED])], 4),
        ("earlier vLLM and SGLang: no topic", [b"", encode_seq(4), encode_payload(0.0, [STORED])], 4),
        ("vLLM 0.32's end marker", [b"", b"", encode_seq(END_SEQ), b""], None),
        ("the earlier end marker", [b"", encode_seq(END_SEQ), b""], None),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_replay_messages_of_both_publishers(what: str, frames: list[bytes], seq: int | None) -> None:
    batch = decode_replay(frames)
    assert (batch.seq if batch is not None else None) == seq
    if batch is not None:
        assert batch.events == (STORED,)


@pytest.mark.parametrize("frames", [[b"x", encode_seq(1), b""], [b""], [b"", b"", b"", b"", b""]])
def test_a_malformed_replay_message_raises(frames: list[bytes]) -> None:
    with pytest.raises(KvWireError):
        decode_replay(frames)
