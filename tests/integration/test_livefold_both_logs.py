"""LiveFold on both logs (a real nats-server and the memory log), through `streams.log.Log`."""

from __future__ import annotations

import asyncio

from streams.definitions import MOTOR_STREAM
from streams.livefold import LiveFold
from streams.reader import Record
from tests.integration.log_backends import Backend, backend
from tests.integration.streams_events import mixed

__all__ = ["backend"]  # the fixture, imported for pytest


async def test_a_fold_started_after_a_checkpoint_at_the_end_has_handled_it(backend: Backend) -> None:
    """Regression (the simulator's seed 39): a controller back from a checkpoint at the log's
    last sequence must not wait for an event a quiet log never appends before it may lead."""
    pub = backend.log.publisher()
    for ev in mixed(5):
        await pub.publish(ev)
    last = (await backend.log.stream_info(MOTOR_STREAM)).last_seq
    seen: list[Record] = []
    fold = LiveFold(backend.log, seen.append, start_seq=last + 1, name="test")
    await fold.start()
    try:
        async with asyncio.timeout(10):
            await fold.caught_up.wait()
        assert fold.position == last
        assert await fold.wait_for(last, within=0.1)
        await pub.publish(mixed(6)[5])
        assert await fold.wait_for(last + 1, within=5.0)
        assert [r.seq for r in seen] == [last + 1]
    finally:
        await fold.close()
