"""Fault injectors: what the chaos scenarios (and `just bench chaos`) do to the real processes.

Each injector acts on the real thing: signals to engine, node agent, controller, coordinator
and nats-server processes; the MOTOR stream purged or deleted and recreated under a running
cluster; poison messages published by a plain NATS client, as any client with publish rights
could. Each returns the wall-clock time the fault took effect (and what it needs to undo it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson
from nats.aio.client import Client

from core import subjects
from core.config import NatsConfig
from deploy.cluster import NATS, LocalCluster
from streams.definitions import MOTOR_STREAM, ensure_streams
from streams.publisher import MOTOR_TYPE, MSG_ID
from tests import localcluster, placed


def signal_pid(pid: int, sig: int) -> float:
    """Send `sig` to one process; the time it was sent."""
    t = time.time()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    return t


async def exited(pid: int, within: float) -> bool:
    """Whether process `pid` (not necessarily our child) exits within `within` s (a pidfd)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    loop = asyncio.get_running_loop()
    gone = loop.create_future()

    def readable() -> None:
        if not gone.done():
            gone.set_result(None)

    loop.add_reader(fd, readable)
    try:
        async with asyncio.timeout(within):
            await gone
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def kill_child(cluster: LocalCluster, name: str, sig: int = signal.SIGKILL) -> float:
    """Signal one of the cluster's own processes (a controller, coordinator or node agent)."""
    t = time.time()
    localcluster.kill_child(cluster, name, sig)
    return t


def child_pid(cluster: LocalCluster, name: str) -> int | None:
    c = cluster.child(name)
    return c.proc.pid if c.proc is not None and c.proc.poll() is None else None


@dataclass
class Freeze:
    """When a process was stopped, and whether the SIGCONT after found it still there."""

    at: float
    continued: bool | None = None  # None until the body ended; False: it had died meanwhile


@contextlib.asynccontextmanager
async def frozen(pid: int) -> AsyncIterator[Freeze]:
    """SIGSTOP `pid` for the body (it accepts connections and answers nothing); SIGCONT after.

    Signalled through a pidfd: a process killed meanwhile (a watchdog's doing) is told apart
    from a live one, and a new process given the same pid is never continued by mistake.
    """
    fd = os.pidfd_open(pid)
    try:
        freeze = Freeze(time.time())
        signal.pidfd_send_signal(fd, signal.SIGSTOP)
        try:
            yield freeze
        finally:
            try:
                signal.pidfd_send_signal(fd, signal.SIGCONT)
                freeze.continued = True
            except ProcessLookupError:  # it died while stopped: there is nothing to continue
                freeze.continued = False
    finally:
        os.close(fd)


@dataclass
class Outage:
    """When NATS went away and when it was back."""

    began: float = 0.0
    ended: float = 0.0


@contextlib.asynccontextmanager
async def nats_down(cluster: LocalCluster, *, freeze: bool = False) -> AsyncIterator[Outage]:
    """NATS away for the body: kill -9 and, after it, a restart on the same port and store;
    or (`freeze`) SIGSTOP and SIGCONT. The supervisor is held off meanwhile."""
    server = cluster.nats
    pid = server.pid
    assert pid is not None, "nats-server is not running"
    out = Outage()
    with cluster.supervisor.hold(NATS):
        out.began = signal_pid(pid, signal.SIGSTOP if freeze else signal.SIGKILL)
        try:
            yield out
        finally:
            if freeze:
                signal_pid(pid, signal.SIGCONT)
            else:
                await server.wait()
                await server.start()
            out.ended = time.time()


async def purge_motor(nc: Client) -> float:
    """Purge MOTOR under the running cluster: its first sequence jumps past what was folded."""
    t = time.time()
    await nc.jetstream().purge_stream(MOTOR_STREAM)
    return t


async def recreate_motor(nc: Client, cfg: NatsConfig, lease_ttl: float) -> float:
    """Delete MOTOR and create it again at once: its sequence goes back to 1."""
    t = time.time()
    js = nc.jetstream()
    await js.delete_stream(MOTOR_STREAM)
    await ensure_streams(js, cfg, lease_ttl=lease_ttl)
    return t


# --------------------------------------------------------------------------- poison

POISON_KINDS = (
    "unknown node command",
    "duplicate Nats-Msg-Id",
    "undecodable JSON",
    "unknown type",
    "future schema_version",
    "non-finite ts",
    "inapplicable instances.refreshed",
    "out-of-bound seen_term",
)
# Poison every folding component must skip and count. The others are harmless when handled:
# a duplicate is never stored, a command for an unknown node is a no-op, and the refresh
# without an `id` decodes — a fold may skip it as inapplicable (counted) or apply it without
# the entry it cannot key; either way it must not stop a fold, a controller or `motor replay`.
MUST_SKIP = frozenset(
    {"undecodable JSON", "unknown type", "future schema_version", "non-finite ts", "out-of-bound seen_term"}
)


def _envelope(etype: str, data: dict[str, Any], *, eid: str, ts: Any = None, version: int = 1) -> bytes:
    body = {
        "id": eid,
        "type": etype,
        "ts": time.time() if ts is None else ts,
        "source": "chaos/poison",
        "caused_by": None,
        "schema_version": version,
        "data": data,
    }
    raw = orjson.dumps(body)
    if ts == "inf":  # JSON has no infinity; 1e999 is valid JSON that every parser reads as inf
        raw = raw.replace(b'"ts":"inf"', b'"ts":1e999')
    return raw


def poison_messages(kind: str, node_id: str, tag: str) -> list[tuple[str, bytes, dict[str, str]]]:
    """(subject, body, headers) to publish for one kind of poison; `node_id` is a real node."""
    eid = f"poison-{tag}"
    fault = {"fault_id": f"f-{tag}", "node_id": node_id, "level": "L1", "code": "ChaosPoison"}
    hdr = {MSG_ID: eid}
    if kind == "inapplicable instances.refreshed":
        # Decodes (the schema allows any dict), but the instance has no `id`.
        data: dict[str, object] = {
            "event": "add",
            "ids": [7001],
            "instances": [{"model_name": "motor-sim", "ip": "127.0.0.1"}],
        }
        body = _envelope("instances.refreshed", data, eid=eid)
        return [(subjects.REFRESH, body, {**hdr, MOTOR_TYPE: "instances.refreshed"})]
    if kind == "undecodable JSON":
        return [(placed.fault(node_id), b'{"id": "' + eid.encode() + b'", "type": "fault.rep', hdr)]
    if kind == "unknown type":
        body = _envelope("chaos.unheard_of", {"node_id": node_id}, eid=eid)
        return [(placed.fault(node_id), body, {**hdr, MOTOR_TYPE: "chaos.unheard_of"})]
    if kind == "future schema_version":
        body = _envelope("fault.reported", fault, eid=eid, version=99)
        return [(placed.fault(node_id), body, {**hdr, MOTOR_TYPE: "fault.reported"})]
    if kind == "non-finite ts":
        body = _envelope("fault.reported", fault, eid=eid, ts="inf")
        return [(placed.fault(node_id), body, {**hdr, MOTOR_TYPE: "fault.reported"})]
    if kind == "out-of-bound seen_term":
        # Issue 24: what one node's credentials may write; a leader announced a reign past it
        # that its lease and checkpoints could not hold, and then nobody could lead.
        refused = {
            "command_id": f"c-{tag}",
            "node_id": node_id,
            "verb": "start",
            "code": "stale_term",
            "reason": "chaos",
            "seen_term": 2**64 - 1,
        }
        body = _envelope("command.refused", refused, eid=eid)
        return [(placed.node(node_id), body, {**hdr, MOTOR_TYPE: "command.refused"})]
    if kind == "duplicate Nats-Msg-Id":
        body = _envelope("fault.cleared", {"fault_id": f"f-{tag}", "node_id": node_id}, eid=eid)
        one = (placed.fault(node_id), body, {**hdr, MOTOR_TYPE: "fault.cleared"})
        return [one, one]
    if kind == "unknown node command":
        ghost = f"ghost-{tag}"
        data = {
            "command_id": eid,
            "node_id": ghost,
            "instance_id": 7002,
            "job_name": "motor",
            "role": "union",
            "engine_type": "builtin",
            "model": "motor-sim",
            "endpoints": [{"id": 0, "ip": "127.0.0.1", "business_port": 1, "mgmt_port": 1}],
            "master_dp_ip": "127.0.0.1",
        }
        body = _envelope("command.start", data, eid=eid)
        return [(placed.command(ghost, "start"), body, {**hdr, MOTOR_TYPE: "command.start"})]
    raise ValueError(f"unknown poison kind {kind!r}")


async def publish_poison(nc: Client, kind: str, node_id: str, tag: str) -> list[int]:
    """Publish one kind of poison; the stream sequences stored (a duplicate stores once)."""
    js = nc.jetstream()
    seqs = []
    for subject, body, hdr in poison_messages(kind, node_id, tag):
        ack = await js.publish(subject, body, headers=hdr, timeout=10)
        if not ack.duplicate:
            seqs.append(int(ack.seq))
    return seqs


async def publish_sentinel(nc: Client, node_id: str, tag: str) -> int:
    """A good, harmless event after the poison (clearing a fault no one reported: a no-op)."""
    eid = f"sentinel-{tag}"
    body = _envelope("fault.cleared", {"fault_id": f"f-sentinel-{tag}", "node_id": node_id}, eid=eid)
    ack = await nc.jetstream().publish(
        placed.fault(node_id), body, headers={MSG_ID: eid, MOTOR_TYPE: "fault.cleared"}, timeout=10
    )
    return int(ack.seq)


async def sleep_until(t: float) -> None:
    """Wait until wall-clock time `t` (a fault's planned length: nothing to await but time)."""
    delay = t - time.time()
    if delay > 0:
        await asyncio.sleep(delay)
