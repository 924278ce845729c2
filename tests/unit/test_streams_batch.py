"""The atomic batch's pure parts: headers, chunks, and what a commit's ack says."""

from __future__ import annotations

from nats.js.errors import APIError

from streams.batch import (
    ATOMIC_DISABLED,
    DUPLICATE_IN_BATCH,
    BatchRefused,
    batch_headers,
    chunks,
    read_batch_ack,
)


def test_each_message_names_its_batch_and_place_and_only_the_last_commits() -> None:
    assert batch_headers("b1", 0, commit=False) == {"Nats-Batch-Id": "b1", "Nats-Batch-Sequence": "1"}
    assert batch_headers("b1", 4, commit=True)["Nats-Batch-Commit"] == "1"


def test_chunks_keep_order_and_size() -> None:
    assert [list(c) for c in chunks(list(range(7)), 3)] == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(chunks([], 3)) == []


def test_a_committed_batch_gives_each_message_its_sequence() -> None:
    assert read_batch_ack(b'{"stream":"MOTOR","seq":12,"batch":"b","count":3}', 3) == ("MOTOR", (10, 11, 12))


def test_refusals_of_the_batch_as_a_batch_are_told_from_refusals_of_its_content() -> None:
    dup = read_batch_ack(
        b'{"error":{"code":400,"err_code":10201,"description":"atomic publish batch contains duplicate message id"}}',
        2,
    )
    assert dup == BatchRefused(DUPLICATE_IN_BATCH, "atomic publish batch contains duplicate message id")
    off = read_batch_ack(
        b'{"error":{"code":400,"err_code":10174,"description":"atomic publish is disabled"}}', 2
    )
    assert isinstance(off, BatchRefused) and off.code == ATOMIC_DISABLED
    fence = read_batch_ack(
        b'{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 7"}}', 2
    )
    assert isinstance(fence, APIError) and fence.err_code == 10071


def test_an_ack_that_does_not_vouch_for_every_message_is_not_trusted() -> None:
    # A server without atomic batches stores each message and acks the last as a single one.
    assert "one by one" in str(read_batch_ack(b'{"stream":"MOTOR","seq":9}', 3))
    assert "for a batch of 3" in str(read_batch_ack(b'{"stream":"MOTOR","seq":9,"batch":"b","count":2}', 3))
    assert "not JSON" in str(read_batch_ack(b"nope", 1))
    assert "not an object" in str(read_batch_ack(b"[1]", 1))
