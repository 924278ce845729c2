"""A whole cluster (`motor up`'s launcher) whose node agents run real vLLM engines.

Each phase gets its own cluster: its own nats-server, one controller, one coordinator and
one node agent per engine, all real processes on free ports, torn down (engines included)
before the next phase starts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from core.config import config_from_dict
from core.events import EndpointStatusChanged, InstanceState, Role
from core.state import ClusterState
from deploy.cluster import LocalCluster
from deploy.watch import StateWatcher
from streams.connection import connect
from tests.integration.nodeagent_harness import EventTail
from tests.localcluster import engine_pid as serving_pid
from tests.localcluster import free_ports
from tests.real.vllm_proc import ROOT, STARTUP_TIMEOUT

# vLLM takes 40 s to minutes to load here: the controller must not give up on a recovery
# while it does (a first start is covered by the section's startup_timeout); requests on a
# busy 2-core machine can take a while too.
CONTROLLER: dict[str, Any] = {
    "recovery_timeout": STARTUP_TIMEOUT,
    "heartbeat_timeout": 15.0,
    "terminate_after": 120.0,
    "tick_interval": 0.5,
}
COORDINATOR: dict[str, Any] = {"first_token_timeout": 300.0, "request_timeout": 600.0, "retries": 2}


def cluster_config(**sections: dict[str, Any]) -> dict[str, Any]:
    """A cluster config (as data) with real-engine timings and the given engine sections."""
    return {
        "controller": CONTROLLER,
        "coordinator": COORDINATOR,
        "nodeagent": {"heartbeat_interval": 1.0, "stop_grace": 30.0},
        **sections,
    }


class RealCluster:
    """The running cluster, a live fold of its log and a tail of its events."""

    def __init__(self, cluster: LocalCluster, watcher: StateWatcher, tail: EventTail) -> None:
        self.cluster = cluster
        self.watcher = watcher
        self.tail = tail

    @property
    def state(self) -> ClusterState:
        return self.watcher.state

    @property
    def base_url(self) -> str:
        return self.cluster.coordinator_url + "/v1"

    async def wait_for(self, what: str, pred: Callable[[ClusterState], bool], within: float) -> float:
        """Poll the folded state until `pred` holds; seconds taken. Fails naming the logs."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < within:
            if pred(self.state):
                return time.monotonic() - t0
            dead = self.cluster.exited()
            if dead:
                names = ", ".join(c.name for c in dead)
                raise AssertionError(f"while waiting for {what}: {names} exited; logs in {self.cluster.logs}")
            await asyncio.sleep(0.5)  # a fold polled: the watcher has no per-change event
        raise AssertionError(f"timed out after {within:.0f}s waiting for {what}; logs in {self.cluster.logs}")

    def instances(self, role: Role) -> list[int]:
        return sorted(i for i, rec in self.state.instances.items() if rec.spec.role == role)

    def active(self, role: Role) -> bool:
        ids = self.instances(role)
        return bool(ids) and all(self.state.instances[i].state == InstanceState.ACTIVE for i in ids)

    def engine_port(self, role: Role) -> int:
        rec = self.state.instances[self.instances(role)[0]]
        node = self.state.nodes[rec.spec.members[0].node_id]
        return node.reg.endpoints[0].business_port

    def engine_log(self, role: Role) -> str:
        """The engine output of the first node of `role` (the node agent's per-endpoint log)."""
        rec = self.state.instances[self.instances(role)[0]]
        path = self.cluster.logs / f"engine-{rec.spec.members[0].node_id}-ep0.log"
        return path.read_text(errors="replace") if path.exists() else ""

    async def wait_dead(self, after: int, within: float) -> EndpointStatusChanged:
        ev = await self.tail.wait(
            lambda e: isinstance(e, EndpointStatusChanged) and e.data.status.value == "DEAD",
            within=within,
            after=after,
        )
        assert isinstance(ev, EndpointStatusChanged)
        return ev


@asynccontextmanager
async def real_cluster(root: Path, raw: dict[str, Any], nodes: int) -> AsyncIterator[RealCluster]:
    """Start the cluster for `raw`; stop every process (engines too) on the way out."""
    cfg = config_from_dict(raw, "<real>")
    cluster = LocalCluster(
        cfg,
        root=root,
        ports=free_ports(nodes),
        nodes=nodes,
        standby=False,
        supervise=False,  # a crash fails the phase at once instead of being restarted
        extra_env={"PYTHONPATH": str(ROOT)},
    )
    watcher: StateWatcher | None = None
    tail: EventTail | None = None
    nc = None
    try:
        await cluster.start()
        nc = await connect(cluster.client_options("admin"), name="real-tests")
        watcher = StateWatcher(nc)
        await watcher.start()
        tail = await EventTail(nc).start()
        yield RealCluster(cluster, watcher, tail)
    finally:
        if tail is not None:
            await tail.close()
        if watcher is not None:
            await watcher.stop()
        if nc is not None:
            await nc.close()
        await cluster.stop(grace=40.0)


def engine_pid(port: int) -> int:
    """The pid of the `vllm serve` main process listening on `port`."""
    return serving_pid(port, b"serve")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group `pgid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out
