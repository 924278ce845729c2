"""The coordinator across a lost log: it keeps routing from its table and folds the new log on top."""

from __future__ import annotations

import asyncio
import time

import pytest
from nats.aio.client import Client
from nats.js import JetStreamContext

from core.events import Role
from streams.definitions import MOTOR_STREAM, ensure_streams
from tests.integration.coord_mgmt_harness import running_mgmt
from tests.unit.coord_events import instance_events


@pytest.mark.parametrize("how", ["purge", "delete-and-recreate"])
async def test_a_lost_log_keeps_the_table_and_the_new_log_is_folded_on_top(
    nc: Client, js: JetStreamContext, how: str
) -> None:
    async with running_mgmt(nc, js) as h:
        await asyncio.wait_for(h.ctx.caught_up.wait(), 20)
        old_seq = await h.append(*instance_events(1, Role.UNION))
        assert [e.key for e in h.ctx.table.routable()] == ["n1/0"]
        if how == "purge":
            await js.purge_stream(MOTOR_STREAM)
        else:
            await js.delete_stream(MOTOR_STREAM)
            await ensure_streams(js)
        deadline = time.monotonic() + 30
        while h.ctx.metrics.registry.get_sample_value("motor_coordinator_log_lost_total") != 1.0:
            # Serving from memory all along: the instance stays routable.
            assert [e.key for e in h.ctx.table.routable()] == ["n1/0"]
            assert (await h.get("/readiness"))[0] == 200
            assert time.monotonic() < deadline, "the lost log was not noticed"
            await asyncio.sleep(0.1)  # the fold checks the stream on its own timer
        seq = await h.append(*instance_events(2, Role.UNION))  # waits until the fold has it
        assert sorted(e.key for e in h.ctx.table.routable()) == ["n1/0", "n2/0"]
        if how == "purge":
            assert seq > old_seq and h.ctx.table.last_seq == seq
        else:
            assert seq <= old_seq and h.ctx.table.last_seq == seq  # the new log's position
