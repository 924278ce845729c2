"""Checkpoints in KV: save/load round trip, missing key, bad key."""

from __future__ import annotations

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from core.reducer import fold
from core.state import state_to_dict
from streams.checkpoint import save_checkpoint
from streams.errors import CheckpointError
from streams.jetstream import JetStreamLog
from streams.publisher import Publisher
from streams.reader import read_range
from tests.integration.checkpoints import load_checkpoint
from tests.unit.factories import assembled, registered


async def test_checkpoint_round_trip_keeps_state_and_seq(js: JetStreamContext, nc: Client) -> None:
    pub = Publisher(js)
    for ev in (registered("a"), registered("b", ts=1.5), assembled(1, ["a", "b"])):
        await pub.publish(ev)
    records = [r async for r in read_range(nc)]
    state = fold((r.seq, r.event) for r in records)

    await save_checkpoint(JetStreamLog.of(js), "controller", state)
    loaded = await load_checkpoint(JetStreamLog.of(js), "controller")

    assert loaded is not None
    assert loaded.last_seq == records[-1].seq
    assert state_to_dict(loaded) == state_to_dict(state)


async def test_missing_checkpoint_is_none(js: JetStreamContext) -> None:
    assert await load_checkpoint(JetStreamLog.of(js), "nobody") is None


async def test_deleted_checkpoint_is_none(js: JetStreamContext) -> None:
    """An operator deletes the checkpoint to force a full replay: that is no checkpoint."""
    from streams.definitions import CHECKPOINT_BUCKET

    await save_checkpoint(JetStreamLog.of(js), "to-delete", fold([(1, registered("a"))]))
    kv = await js.key_value(CHECKPOINT_BUCKET)
    await kv.delete("to-delete")
    assert await load_checkpoint(JetStreamLog.of(js), "to-delete") is None
    await save_checkpoint(JetStreamLog.of(js), "to-purge", fold([(1, registered("a"))]))
    await kv.purge("to-purge")
    assert await load_checkpoint(JetStreamLog.of(js), "to-purge") is None


async def test_bad_checkpoint_key_names_the_key(js: JetStreamContext) -> None:
    with pytest.raises(CheckpointError, match="no spaces"):
        await load_checkpoint(JetStreamLog.of(js), "no spaces")
