"""A batch of events in one round trip, all or nothing: JetStream's atomic batch publish.

The controller appends a decide's decisions as one batch (`Publisher.publish_batch`). Sent one
by one, each waiting for its ack, a cold start of 1000 nodes spent most of its time in round
trips (`just bench fleet`); sent pipelined without waiting, a connection that dies mid-way
loses a message while the ones after it, buffered by the client, land after the reconnect: a
later decision in the log without an earlier one, which no fold can apply. An atomic batch
(nats-server 2.12 and later, stream `allow_atomic`) has neither problem: every message carries
the batch id and its place, the last one commits, and the stream stores all of them in order
and contiguously, or none; one ack answers for the batch, and a fence refuses all of it.

A stream refuses a batch as a batch when a message id in it is stored already (a decision made
again: an atomic batch does not deduplicate, it refuses), when atomic publishing is off, or
when it holds more than 1000 messages (the server's limit: chunks of at most that many go one
after another, each committed before the next is sent). The publisher then sends that chunk
one message at a time, each awaiting its ack, deduplicated as `Publisher.publish` is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import orjson
from nats.js.errors import APIError

from streams.errors import StreamsError

BATCH_ID = "Nats-Batch-Id"
BATCH_SEQUENCE = "Nats-Batch-Sequence"
BATCH_COMMIT = "Nats-Batch-Commit"
ATOMIC_LIMIT = 1000  # nats-server's largest atomic batch
DUPLICATE_IN_BATCH = 10201  # "atomic publish batch contains duplicate message id"
ATOMIC_DISABLED = 10174  # "atomic publish is disabled"
BATCH_TOO_LARGE = 10199
NOT_AS_A_BATCH = frozenset({DUPLICATE_IN_BATCH, ATOMIC_DISABLED, BATCH_TOO_LARGE})

T = TypeVar("T")

Outcomes = list[int | StreamsError]


@dataclass(frozen=True, slots=True)
class BatchRefused:
    """The stream would not take these messages as one batch (they may go one by one)."""

    code: int
    description: str


def batch_headers(batch_id: str, index: int, *, commit: bool) -> dict[str, str]:
    """The headers that place message `index` (from 0) in batch `batch_id`; the last commits."""
    hdr = {BATCH_ID: batch_id, BATCH_SEQUENCE: str(index + 1)}
    if commit:
        hdr[BATCH_COMMIT] = "1"
    return hdr


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """`items` in consecutive slices of at most `size`."""
    for i in range(0, len(items), size):
        yield items[i : i + size]


async def publish_in_chunks(
    items: Sequence[T],
    *,
    atomic: Callable[[Sequence[T]], Awaitable[Outcomes | None]],
    one: Callable[[T], Awaitable[int]],
    go_on: Callable[[], bool] | None = None,
) -> Outcomes:
    """Every outcome in order: each chunk of at most ATOMIC_LIMIT as one atomic batch
    (`atomic`; None: the stream will not take it as a batch), else one by one (`one`, each
    awaiting its ack). Nothing more is sent once `go_on()` is false or a chunk failed, so the
    list may end early. Both logs' publishers share it, so they fall back alike."""
    out: Outcomes = []
    for chunk in chunks(items, ATOMIC_LIMIT):
        if go_on is not None and not go_on():
            break
        got = await atomic(chunk) if len(chunk) > 1 else None
        if got is None:
            got = []
            for i, item in enumerate(chunk):
                if i and go_on is not None and not go_on():
                    break
                try:
                    got.append(await one(item))
                except StreamsError as exc:
                    got.append(exc)
                    break
        out += got
        if len(got) < len(chunk) or not all(isinstance(o, int) for o in got):
            break
    return out


def read_batch_ack(raw: bytes, count: int) -> tuple[str, tuple[int, ...]] | BatchRefused | APIError | str:
    """What the commit's ack says: (stream, each message's sequence), a refusal of the batch as
    a batch, a refusal of its content (a moved fence), or why the ack cannot be trusted (text)."""
    try:
        ack = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return "an ack that is not JSON"
    if not isinstance(ack, dict):
        return f"an ack that is not an object: {ack!r}"
    err = ack.get("error")
    if isinstance(err, dict):
        code = err.get("err_code")
        if code in NOT_AS_A_BATCH:
            return BatchRefused(int(code), str(err.get("description", "")))
        return APIError(code=err.get("code"), err_code=code, description=err.get("description"))
    seq, stream, stored = ack.get("seq"), ack.get("stream"), ack.get("count")
    if "batch" not in ack or not isinstance(stored, int):
        return "the server stored the batch's messages one by one (it knows no atomic batches)"
    if not isinstance(seq, int) or not isinstance(stream, str) or stored != count:
        return f"an ack of {stored!r} messages for a batch of {count}: {ack!r}"
    return stream, tuple(range(seq - count + 1, seq + 1))
