"""The coordinator's fault events against a real nats-server that goes away: posting never waits,
a full queue drops (counted), and what was queued lands once NATS is back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from coordinator.breaker import BreakerState, CircuitChange
from coordinator.faultlog import FaultLog, FaultOutbox
from coordinator.metrics import CoordinatorMetrics
from coordinator.table import RoutingTable
from streams.connection import connect
from streams.definitions import MOTOR_STREAM, ensure_streams
from streams.publisher import Publisher
from streams.reader import read_range
from streams.server import EmbeddedNats


async def test_fault_events_never_wait_for_nats_and_land_when_it_is_back(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats")
    await server.start()
    nc = await connect(server.url, name="outbox-test")
    outbox: FaultOutbox | None = None
    try:
        js = nc.jetstream()
        await ensure_streams(js)
        metrics = CoordinatorMetrics()
        outbox = FaultOutbox(Publisher(js, ack_timeout=1.0), capacity=8, metrics=metrics)
        log = FaultLog(RoutingTable(), outbox.post, coordinator="c1", source="coordinator/c1")
        log.circuit(CircuitChange("n0/0", BreakerState.OPEN, "before the outage", 3, 30))
        deadline = time.monotonic() + 10
        while outbox.published < 1:
            assert time.monotonic() < deadline, "the first event never went out"
            await asyncio.sleep(0.05)

        await server.stop()
        t0 = time.perf_counter()
        for i in range(1, 21):  # a storm of circuit changes while NATS is away
            log.circuit(CircuitChange(f"n{i}/0", BreakerState.OPEN, "transport", 3, 30))
        assert time.perf_counter() - t0 < 0.05  # posting never waited for NATS
        assert outbox.dropped == 12 and outbox.pending == 8
        await asyncio.sleep(1.5)  # the outbox keeps trying meanwhile, and nothing else breaks

        await server.start()  # same port, same store
        deadline = time.monotonic() + 30
        while True:
            recs = [r async for r in read_range(nc, MOTOR_STREAM)]
            got = sorted(r.event.data.endpoint for r in recs if r.event.type == "coordinator.circuit_changed")
            if len(got) >= 9:
                break
            assert time.monotonic() < deadline, f"queued events did not land: {got}"
            await asyncio.sleep(0.2)
        assert got == sorted(f"n{i}/0" for i in range(9))  # no duplicate: retries keep the event id
        text = metrics.render().decode()
        assert 'motor_coordinator_fault_events_dropped_total{reason="queue_full"} 12.0' in text
        assert 'motor_coordinator_fault_events_total{type="coordinator.circuit_changed"} 9.0' in text
        assert outbox.pending == 0
    finally:
        if outbox is not None:
            await outbox.close()
        await nc.close()
        await server.stop()
