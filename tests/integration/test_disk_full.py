"""A full disk under the NATS store (issue 24): writes refused with a clear error, nothing
acknowledged lost, writes again once there is room.

Each test runs its own nats-server on a small tmpfs (root only: `mount`), sized as `motor up`
sizes it (`deploy.natshealth.plan`). Two ways to be full:
- MOTOR reaches its `nats.max_bytes`: the next publish is refused `StoreFull` naming the limit
  and what to do, the server stays healthy, no older event is dropped, a node agent's outbox
  keeps the refused event (before: dropped after its reject budget), and raising the limit
  lets it land;
- something else fills the disk: nats-server fails a write with ENOSPC, answers no publish
  and stays wedged after space returns; the supervisor's probe (its health check's write
  error) restarts it once the disk has room, and writes resume (before: wedged for good).
And a `nats.max_bytes` the server's store cannot hold is refused naming it, on create and on
change (no tmpfs needed).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from nats.aio.client import Client
from nats.js import JetStreamContext

from core.config import NatsConfig
from core.events import EndpointStatus, EndpointStatusChanged, EndpointStatusChangedData, EventBase
from core.ids import new_id
from core.storelimits import MiB
from deploy.natshealth import plan, watch
from deploy.supervise import Supervisor
from nodeagent.metrics import AgentMetrics
from nodeagent.outbox import Outbox
from streams.connection import connect
from streams.definitions import MOTOR_STREAM, ensure_streams
from streams.errors import PublishTimeout, StoreFull, StreamsError
from streams.publisher import MSG_ID, Publisher
from streams.server import EmbeddedNats
from tests.localcluster import tmpfs

pytestmark = pytest.mark.timeout(180)

DISK = 24 * MiB
MAX_BYTES = 4 * MiB


def _event(i: int) -> EventBase:
    # ~2 KiB a message: the store fills in a few thousand publishes.
    data = EndpointStatusChangedData(
        node_id="d1", endpoint_id=i % 4, status=EndpointStatus.READY, reason=f"r{i} " + "x" * 2000
    )
    return EndpointStatusChanged(id=new_id(), ts=time.time(), source="nodeagent/d1", data=data)


class Store:
    """A nats-server on a tmpfs, with a client, MOTOR sized to `max_bytes`."""

    def __init__(self, server: EmbeddedNats, nc: Client, cfg: NatsConfig) -> None:
        self.server = server
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.cfg = cfg
        self.acked: dict[int, str] = {}  # stream sequence -> event id, every ack we got

    async def publish(self, pub: Publisher, event: EventBase) -> int:
        seq = await pub.publish(event)
        self.acked[seq] = event.id
        return seq

    async def fill(self, pub: Publisher, limit: int = 20_000) -> StreamsError:
        """Publish until the store refuses; return the refusal."""
        for i in range(limit):
            try:
                await self.publish(pub, _event(i))
            except StreamsError as exc:
                return exc
        raise AssertionError(f"{limit} publishes and the store never refused one")

    async def all_acked_readable(self) -> None:
        """Every event JetStream acknowledged is in MOTOR at its sequence."""
        missing = []
        for seq, eid in self.acked.items():
            msg = await self.js.get_msg(MOTOR_STREAM, seq)
            if (msg.headers or {}).get(MSG_ID) != eid:
                missing.append(seq)
        assert not missing, f"{len(missing)} of {len(self.acked)} acknowledged events lost: {missing[:10]}"


@pytest_asyncio.fixture(loop_scope="session")
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    with tmpfs(tmp_path / "store", DISK) as mnt:
        sized = plan(mnt, MAX_BYTES)
        server = EmbeddedNats(mnt, log_file=tmp_path / "nats.log", max_file_store=sized.max_file_store)
        await server.start()
        try:
            nc = await connect(server.url, name="disk-full")
            cfg = NatsConfig(urls=[server.url], max_bytes=sized.max_bytes)
            await ensure_streams(nc.jetstream(), cfg)
            try:
                yield Store(server, nc, cfg)
            finally:
                await nc.close()
        finally:
            await server.stop()


async def test_a_full_motor_refuses_clearly_keeps_every_ack_and_writes_again_after_the_limit_is_raised(
    store: Store,
) -> None:
    pub = Publisher(store.js, ack_timeout=5.0)
    refused = await store.fill(pub)
    assert isinstance(refused, StoreFull), f"not a clear refusal: {type(refused).__name__}: {refused}"
    assert "nats.max_bytes" in str(refused) and "maximum bytes exceeded" in str(refused)
    assert len(store.acked) > 1000
    assert await store.server.write_error() is None  # refused by the limit, not wedged by the disk

    # A node agent's event refused for being over the limit is kept, past its reject budget.
    metrics = AgentMetrics("d1")
    outbox = Outbox(Publisher(store.js, ack_timeout=5.0), metrics, reject_budget=1.0, max_backoff=0.5)
    outbox.start()
    try:
        kept = outbox.post(_event(-1))
        await asyncio.sleep(3.0)
        assert not kept.done(), f"the outbox gave up on the event: {kept.exception()}"
        assert metrics.events_dropped.labels("d1", "endpoint.status_changed")._value.get() == 0
        assert metrics.publishes_store_full.labels("d1")._value.get() >= 2  # tried again, and counted

        info = await store.js.stream_info(MOTOR_STREAM)
        assert info.state.messages == len(store.acked)  # nothing dropped to make room
        await store.all_acked_readable()

        # The operator raises the limit: the kept event lands, then new ones.
        await ensure_streams(store.js, store.cfg.model_copy(update={"max_bytes": MAX_BYTES + 2 * MiB}))
        store.acked[await asyncio.wait_for(kept, 20)] = "?"
    finally:
        await outbox.close()
    store.acked = {s: e for s, e in store.acked.items() if e != "?"}
    await store.publish(pub, _event(-2))
    await store.all_acked_readable()


async def test_a_disk_filled_by_something_else_wedges_nats_until_the_supervisor_restarts_it(
    store: Store, tmp_path: Path
) -> None:
    supervisor = Supervisor()
    supervisor.watch(watch(store.server, "nats-server", supervisor.notify))
    pub = Publisher(store.js, ack_timeout=2.0)
    filler = store.server.store_dir / "filler"
    try:
        for i in range(50):
            await store.publish(pub, _event(i))
        # Something else takes the rest of the disk.
        with filler.open("wb") as fh, contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * MiB)
                fh.flush()
        refused = await store.fill(pub)
        assert isinstance(refused, PublishTimeout), f"{type(refused).__name__}: {refused}"
        assert "no space left on device" in (await store.server.write_error() or "")
        await asyncio.sleep(3.0)  # the disk is still full: a restart would only fail again
        assert supervisor.restarts("nats-server") == 0
        stuck = [n.describe() for n in supervisor.notices if n.kind == "stuck"]
        assert len(stuck) == 1 and "free disk space there" in stuck[0], stuck  # said once, while full

        filler.unlink()
        async with asyncio.timeout(30):
            while supervisor.restarts("nats-server") < 1:  # noqa: ASYNC110 (the supervisor's own count)
                await asyncio.sleep(0.2)
        wedged = [n for n in supervisor.notices if n.kind == "wedged"]
        assert wedged and "no space left on device" in wedged[0].describe()

        async with asyncio.timeout(30):  # reconnected to the restarted server: writes again
            while True:
                try:
                    await store.publish(pub, _event(10_000))
                    break
                except StreamsError:
                    await asyncio.sleep(0.5)
        await store.all_acked_readable()
        assert await store.server.write_error() is None
    finally:
        await supervisor.stop()
        filler.unlink(missing_ok=True)


async def test_a_max_bytes_the_server_cannot_hold_is_refused_naming_it(tmp_path: Path) -> None:
    """No tmpfs needed: the server's store cap alone refuses a MOTOR that would not fit it."""
    async with EmbeddedNats(tmp_path / "nats", max_file_store=8 * MiB) as server:
        nc = await connect(server.url, name="disk-full")
        try:
            js = nc.jetstream()
            with pytest.raises(StreamsError, match=r"cannot create stream MOTOR: .*nats\.max_bytes"):
                await ensure_streams(js, NatsConfig(max_bytes=16 * MiB))
            await ensure_streams(js, NatsConfig(max_bytes=2 * MiB))
            with pytest.raises(StreamsError, match=r"cannot update stream MOTOR: .*nats\.max_bytes"):
                await ensure_streams(js, NatsConfig(max_bytes=16 * MiB))
        finally:
            await nc.close()
