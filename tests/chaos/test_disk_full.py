"""The disk under the NATS store fills up under client traffic (issue 24), then space returns.

The cluster's store is a small tmpfs (`motor up` sizes MOTOR and the server's store to it,
`deploy.natshealth`); something else (a file, as a runaway log would) takes the rest of the
disk for 15 s. nats-server fails its next write with ENOSPC and from then on answers no
publish, and keeps the failed stream in that error after space returns: before the fix the
log took nothing until someone restarted it by hand. Now `motor up`'s supervisor sees the
write error on the server's health check, waits while the disk is full (a restart would fail
again, and says so) and restarts it once there is room; the processes reconnect and send
what they kept. Clients must not notice (requests never touch NATS), nothing may be judged by
the silence, engines keep running, and every event JetStream acknowledged is still in the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from deploy.cluster import NATS
from tests.chaos import invariants as inv
from tests.chaos.conftest import ClusterPool
from tests.chaos.fleet import engines, pid_on
from tests.chaos.harness import ChaosCluster
from tests.chaos.scenario import Scenario, until_restarted
from tests.multihost.invariants import acked_kept

pytestmark = [pytest.mark.chaos, pytest.mark.timeout(600)]

DISK = 64 * 1024 * 1024  # the tmpfs under the NATS store
FULL_FOR = 15.0


@pytest.fixture
async def small_disk(pool: ClusterPool) -> ChaosCluster:
    """A cluster whose NATS store is on a 64 MiB tmpfs (two coordinator replicas)."""
    return await pool.get(coordinators=2, disk=DISK)


def fill(path: Path) -> int:
    """Write `path` until the disk is full; the bytes it took."""
    n = 0
    chunk = b"\0" * (1024 * 1024)
    with path.open("wb") as fh, contextlib.suppress(OSError):
        while True:
            fh.write(chunk)
            fh.flush()
            n += len(chunk)
    return n


def said_so(cc: ChaosCluster, since: float, room_at: float) -> inv.Check:
    """The supervisor named the write error and restarted the server once the disk had room,
    not before (a restart on a full disk would only fail again)."""
    name = "12 a full disk named and healed"
    notices = [n for n in cc.cluster.supervisor.notices if n.name == NATS and n.at >= since]
    wedged = [n for n in notices if n.kind == "wedged"]
    restarted = [n for n in notices if n.kind == "restarted"]
    if not wedged or "no space left on device" not in wedged[0].detail:
        return inv.Check(
            name, False, f"no wedged notice naming the full disk: {[n.describe() for n in notices]}"
        )
    if wedged[0].at < room_at:
        return inv.Check(name, False, f"restarted {room_at - wedged[0].at:.1f} s before the disk had room")
    if not restarted:
        return inv.Check(name, False, "killed but never started again")
    return inv.Check(
        name,
        True,
        f"'{wedged[0].describe()[:120]}…'; restarted {restarted[0].at - room_at:.1f} s after space returned",
    )


async def test_disk_full(small_disk: ChaosCluster) -> None:
    cc = small_disk
    server = cc.cluster.nats
    filler = server.store_dir / "filler"
    sc = await Scenario.begin(cc, f"the NATS store's disk full {FULL_FOR:g} s (a file takes the rest of it)")
    state = await cc.fold()
    assert state is not None
    pids = {e.port: pid_on(e.port) for e in engines(state)}
    before = cc.cluster.restarts(NATS)
    try:
        async with sc.traffic():
            began = sc.fault(time.time())
            took_bytes = await asyncio.to_thread(fill, filler)
            print(f"   filler took {took_bytes / 2**20:.0f} MiB", flush=True)
            async with asyncio.timeout(20):  # the next heartbeat's write fails
                while await server.write_error() is None:  # noqa: ASYNC110 (the server's own health check)
                    await asyncio.sleep(0.5)
            print(f"   nats-server: {await server.write_error()}", flush=True)
            await asyncio.sleep(max(0.0, began + FULL_FOR - time.time()))
            restarted_while_full = cc.cluster.restarts(NATS) - before
            filler.unlink()
            room_at = time.time()
            back = await until_restarted(cc, NATS, before, within=30)
            took = await sc.converge(room_at)
        entries = await sc.common(fault_ended=room_at, killed=(NATS,), nats_trouble=True, took=took)
    finally:
        filler.unlink(missing_ok=True)
    sc.check(
        inv.Check(
            "12 no restart while the disk was full",
            restarted_while_full == 0,
            f"nats-server restarted {restarted_while_full}× while full; back after space returned: {back}",
        )
    )
    sc.check(said_so(cc, began, room_at))
    sc.check(inv.nothing_judged_by_outage(entries, began))
    sc.check(inv.engines_kept(pids, {p: pid_on(p) for p in pids}, entries, began))
    audit, why = await cc.ack_audit()
    sc.check(acked_kept(audit, why))
    sc.finish()
