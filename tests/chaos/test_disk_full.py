"""The log's disk full under client traffic (issue 24): MOTOR at its `nats.max_bytes`, and the
disk under the NATS store filled by something else; then room returns.

MOTOR at its limit (`test_motor_full`: its max_bytes lowered to what it holds for 10 s, as if
it had filled up): every publish to it is refused `StoreFull`, naming the limit and what to do.
An operator's `motor fault report` fails with that message; a node agent killed meanwhile is
restarted and keeps its registration until the limit is raised, then it lands; nothing is
dropped, clients see nothing.

The disk full (`test_disk_full`): the cluster's store is a small tmpfs (`motor up` sizes MOTOR and the server's store to it,
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
from streams.definitions import MOTOR_STREAM, ensure_streams
from tests.chaos import invariants as inv
from tests.chaos.conftest import ClusterPool
from tests.chaos.faults import kill_child
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
    stuck = [n for n in notices if n.kind == "stuck" and n.at < room_at]
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
    if not stuck:
        return inv.Check(name, False, "the full disk was not said while it lasted")
    return inv.Check(
        name,
        True,
        f"said while full: '{stuck[0].describe()[:90]}…'; then '{wedged[0].describe()[:60]}…', "
        f"restarted {restarted[0].at - room_at:.1f} s after space returned",
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


AGENT = "nodeagent-decode-0"


def kept_not_dropped(log: Path, since_line: int) -> inv.Check:
    """The node agent said why its events waited, and dropped none."""
    name = "13 refused events kept"
    lines = log.read_text(errors="replace").splitlines()[since_line:]
    full = [ln for ln in lines if "MOTOR is at its nats.max_bytes" in ln]
    dropped = [ln for ln in lines if "dropped, it cannot be published" in ln]
    if dropped:
        return inv.Check(name, False, f"{len(dropped)} event(s) dropped: {dropped[0][-200:]}")
    if not full:
        return inv.Check(name, False, f"{log.name} never said MOTOR was full")
    return inv.Check(name, True, f"{len(full)} retries logged naming the limit, none dropped")


async def test_motor_full(small_disk: ChaosCluster) -> None:
    cc = small_disk
    js = cc.admin.jetstream()
    info = await js.stream_info(MOTOR_STREAM)
    limit = info.config.max_bytes
    sc = await Scenario.begin(
        cc, f"MOTOR at its nats.max_bytes for 10 s ({limit / 2**20:.0f} MiB: lowered to what it holds)"
    )
    log = cc.cluster.logs / f"{AGENT}.log"
    since_line = len(log.read_text(errors="replace").splitlines())
    node = AGENT.removeprefix("nodeagent-")
    before = cc.cluster.restarts(AGENT)
    async with sc.traffic():
        info.config.max_bytes = info.state.bytes
        await js.update_stream(info.config)
        began = sc.fault(time.time())
        refused = await cc.motor("fault", "report", "--node", node, "--code", "E1", "--level", "L2")
        kill_child(cc.cluster, AGENT)
        await until_restarted(cc, AGENT, before)
        await asyncio.sleep(max(0.0, began + 10.0 - time.time()))
        await ensure_streams(js, cc.cluster.cfg.nats, lease_ttl=cc.cluster.cfg.controller.lease_ttl)
        raised = time.time()
        took = await sc.converge(raised)
    entries = await sc.common(fault_ended=raised, killed=(AGENT,), took=took)
    moved = [
        f"seq {e.seq} {e.data.get('instance_id')} {e.data.get('state')}"
        for e in entries
        if e.type == "instance.state_changed"
    ]
    print(f"   instance states since the fault: {', '.join(moved) or 'none'}", flush=True)
    said = refused.stderr + refused.stdout
    sc.check(
        inv.Check(
            "12 a refused write says so",
            refused.returncode != 0 and "nats.max_bytes" in said,
            f"`motor fault report` exit {refused.returncode}: {said.strip()[-160:]}",
        )
    )
    sc.check(kept_not_dropped(log, since_line))
    landed = [
        e for e in entries if e.type == "node.registered" and e.data.get("node_id") == node and e.ts >= began
    ]
    sc.check(
        inv.Check(
            "13 kept events land once there is room",
            bool(landed) and all(e.seq > 0 for e in landed),
            f"{node}'s registration from its restart landed at seq {landed[0].seq}"
            if landed
            else "never landed",
        )
    )
    audit, why = await cc.ack_audit()
    sc.check(acked_kept(audit, why))
    sc.finish()
