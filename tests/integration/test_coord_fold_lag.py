"""The coordinator's fold lag: append (the stream's timestamp) to fold, counted once caught up."""

from __future__ import annotations

import asyncio
import time

from nats.aio.client import Client
from nats.js import JetStreamContext
from prometheus_client import CollectorRegistry

from core.events import Role
from streams.publisher import Publisher
from tests.integration.coord_mgmt_harness import running_mgmt
from tests.unit.coord_events import heartbeat, instance_events

LAG = "motor_coordinator_fold_lag_seconds"


def _count(registry: CollectorRegistry, stream: str) -> float:
    return float(registry.get_sample_value(f"{LAG}_count", {"stream": stream}) or 0.0)


async def test_fold_lag_counts_live_events_from_their_append_not_the_replayed_ones(
    nc: Client, js: JetStreamContext
) -> None:
    before = instance_events(1, Role.UNION)
    pub = Publisher(js)
    for ev in before:
        await pub.publish(ev)
    async with running_mgmt(nc, js) as h:
        await asyncio.wait_for(h.ctx.caught_up.wait(), 20)
        reg = h.ctx.metrics.registry
        assert _count(reg, "MOTOR") == 0  # replayed at start-up: old, not late
        live = instance_events(2, Role.UNION)
        await h.append(*live)
        assert _count(reg, "MOTOR") == len(live)
        # The builders stamp ts=1.0 (1970): a lag measured from the event's own ts would be
        # decades; from the append it is the fold's delay.
        total = reg.get_sample_value(f"{LAG}_sum", {"stream": "MOTOR"})
        assert total is not None and 0 <= total < 5.0 * len(live)
        await pub.publish(heartbeat("n2", (0, 1, 0)))
        deadline = time.monotonic() + 20
        while _count(reg, "MOTOR_HB") < 1:
            assert time.monotonic() < deadline, "the heartbeat was not folded"
            await asyncio.sleep(0.05)  # heartbeats have no sequence to wait on
        hb_total = reg.get_sample_value(f"{LAG}_sum", {"stream": "MOTOR_HB"})
        assert hb_total is not None and 0 <= hb_total < 5.0
