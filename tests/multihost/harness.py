"""Motor on three hosts: `motor up`'s launcher placing every process on a network namespace.

| host | nats | controller | coordinator | node agents (builtin engines) |
|------|------|------------|-------------|-------------------------------|
| h1   | n1   | c1         | coordinator-1 | union-0 |
| h2   | n2   | c2         | —           | prefill-0 |
| h3   | n3   | —          | coordinator-2 | decode-0, union-1 |

Two union instances and a 1P1D pair: whichever host is lost, a path of the model is left.
The MOTOR log and the KV buckets are replicated on all three servers; every process is given
the three URLs and reaches the others only over the bridge, so cutting a host's link is a
network partition and killing its namespace is a host failure. Each process records what
JetStream acknowledged to it (`MOTOR_ACK_JOURNAL`), so a scenario can check that nothing
acknowledged was lost. The client drives traffic from the root namespace to both
coordinators, moving to the other one when its connection fails (as behind a load balancer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import orjson
from nats.aio.client import Client

from core.config import ClusterConfig
from core.events import InstanceState, Role
from core.state import ClusterState
from deploy.cluster import LocalCluster
from deploy.hosts import Host
from deploy.watch import snapshot_state
from streams.connection import connect
from streams.definitions import MOTOR_STREAM
from streams.log import Range
from streams.placement import StreamPlacement, stream_placement
from streams.reader import read_deliveries
from tests.chaos.fleet import counter, pid_on, scrape
from tests.chaos.harness import chaos_config, entry
from tests.chaos.invariants import Entry, Proc
from tests.chaos.load import SPECS, LoadGen, Outcome, reference_texts, run_one
from tests.localcluster import free_ports
from tests.multihost.netns import Network, sweep

MOTOR = [sys.executable, "-m", "deploy.cli"]
PLACEMENT = {
    "nats-n1": "h1",
    "nats-n2": "h2",
    "nats-n3": "h3",
    "controller-c1": "h1",
    "controller-c2": "h2",
    "coordinator-1": "h1",
    "coordinator-2": "h3",
    "nodeagent-union-0": "h1",
    "nodeagent-prefill-0": "h2",
    "nodeagent-decode-0": "h3",
    "nodeagent-union-1": "h3",
}
INSTANCES = 4  # two union instances, one prefill, one decode
HEARTBEAT_TIMEOUT = 8.0
# A stream stalled behind a cut coordinator is given up after this and sent to the other one.
CLIENT_TIMEOUT = openai.Timeout(15.0, connect=2.0)


def multihost_config() -> ClusterConfig:
    """The chaos suite's config (shipped breaker and lease), two unions, and heartbeats judged
    after 8 s: a node agent whose server was cut off needs ~3 s to notice (PINGs unanswered,
    streams.connection) and a moment to reach another, the production default being 10 s."""
    cfg = chaos_config()
    assert cfg.union is not None
    return cfg.model_copy(
        update={
            "union": cfg.union.model_copy(update={"instances": 2}),
            "controller": cfg.controller.model_copy(update={"heartbeat_timeout": HEARTBEAT_TIMEOUT}),
        }
    )


@dataclass(frozen=True, slots=True)
class Engine:
    """One engine endpoint of an ACTIVE instance, where it runs."""

    role: Role
    instance_id: int
    node_id: str
    ip: str
    port: int

    @property
    def label(self) -> str:
        return f"{self.role.value} engine ({self.node_id} {self.ip}:{self.port})"


def converged(state: ClusterState) -> bool:
    """Every instance the config asks for ACTIVE with every endpoint READY."""
    good = 0
    for inst in state.instances.values():
        if inst.state != InstanceState.ACTIVE:
            continue
        nodes = [state.nodes.get(m.node_id) for m in inst.spec.members]
        if all(n is not None and n.all_ready() for n in nodes):
            good += 1
    return good >= INSTANCES


def not_active(state: ClusterState) -> str:
    """The instances that are not ACTIVE, for a failure message."""
    bad = [f"{i} {r.spec.role.value} {r.state.value}" for i, r in sorted(state.instances.items())]
    return ", ".join(b for b in bad if "ACTIVE" not in b) or f"{len(state.instances)} instance(s)"


def engines(state: ClusterState) -> list[Engine]:
    """Every engine endpoint of every ACTIVE instance."""
    out = []
    for iid, inst in sorted(state.instances.items()):
        if inst.state != InstanceState.ACTIVE:
            continue
        for m in inst.spec.members:
            for ep in m.endpoints:
                out.append(Engine(inst.spec.role, iid, m.node_id, m.ip, ep.business_port))
    return out


async def served(e: Engine) -> float:
    """Tokens the engine processed so far (0 while it cannot be reached)."""
    text = await scrape(f"http://{e.ip}:{e.port}/metrics", limit=2.0)
    return counter(text, "vllm:prompt_tokens_total", "vllm:generation_tokens_total")


class MultiHost:
    """The network, the cluster on it and what a scenario reads from outside."""

    refs: dict[str, str] = {}

    def __init__(self, base: Path) -> None:
        self.base = base
        self.net = Network()
        self.cfg = multihost_config()
        self._cluster: LocalCluster | None = None
        self._nc: Client | None = None
        self.generation = 0

    @property
    def cluster(self) -> LocalCluster:
        assert self._cluster is not None, "not started"
        return self._cluster

    @property
    def nc(self) -> Client:
        assert self._nc is not None, "not started"
        return self._nc

    @property
    def acks(self) -> Path:
        return self.cluster.root / "acks"

    @property
    def coordinator_urls(self) -> list[str]:
        return [f"{u}/v1" for u in self.cluster.coordinator_urls()]

    @property
    def base_url(self) -> list[str]:
        """Where the load's clients send requests (tests.chaos.scenario.Scenario.traffic)."""
        return self.coordinator_urls

    client_timeout = CLIENT_TIMEOUT

    async def start(self) -> None:
        """Build the hosts, start the cluster on them, wait until every instance serves."""
        self.generation += 1
        left = await asyncio.to_thread(sweep)
        if left:
            print(f"   removed what an earlier run left: {', '.join(left)}", flush=True)
        hosts = await asyncio.to_thread(self.net.build)
        root = self.base / f"cluster-{self.generation}"
        self._cluster = LocalCluster(
            self.cfg,
            root=root,
            ports=free_ports(4, nats_servers=3),
            nodes=4,
            nats_cluster=3,
            coordinators=2,
            supervise=True,
            hosts=hosts,
            placement=PLACEMENT,
            extra_env={"PYTHONPATH": os.getcwd(), "MOTOR_ACK_JOURNAL": str(root / "acks")},
        )
        try:
            await self._cluster.start()
            self._nc = await connect(self._cluster.client_options("inspect"), name="multihost")
            await self.wait_until("every instance ACTIVE", converged, 120)
            await self.wait_serving(60)
            if not MultiHost.refs:
                MultiHost.refs = await reference_texts(self.coordinator_urls[0])
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Stop the cluster and remove the network (also after a failure)."""
        try:
            if self._nc is not None:
                with contextlib.suppress(Exception):
                    await self._nc.close()
                self._nc = None
            if self._cluster is not None:
                await self._cluster.stop(grace=5.0)
        finally:
            self._cluster = None
            await asyncio.to_thread(self.net.teardown)

    async def ensure_healthy(self, within: float = 45.0) -> None:
        """What the last scenario left converged and serving, or a fresh cluster."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            state = await self.fold()
            if (
                state is not None
                and converged(state)
                and all([await self.one_ok(u) for u in self.coordinator_urls])
            ):
                return
            await asyncio.sleep(0.5)
        print(f"\n-- not healed within {within:g} s: a fresh cluster", flush=True)
        await self.stop()
        self.net = Network()
        await self.start()

    # ------------------------------------------------------------------ hosts

    def host(self, name: str) -> Host:
        return self.cluster.host(name)

    def processes_on(self, host: Host) -> list[str]:
        """The supervised names of the processes placed on `host` (nats-server first)."""
        names = [f"nats-{m.name}" for m in self.cluster.nats_members if m.host.name == host.name]
        names += [c.name for c in self.cluster.children if c.host.name == host.name]
        return names

    def node_ids_on(self, host: Host) -> list[str]:
        return [c.name.removeprefix("nodeagent-") for c in self.cluster.children
                if c.host.name == host.name and c.name.startswith("nodeagent-")]  # fmt: skip

    def sources_on(self, host: Host) -> list[str]:
        """The `source` of what the host's processes append (`controller/c1`, `nodeagent/union-0`)."""
        out = []
        for name in self.processes_on(host):
            if name.startswith("controller-"):
                out.append(f"controller/{name.removeprefix('controller-')}")
            elif name.startswith("nodeagent-"):
                out.append(f"nodeagent/{name.removeprefix('nodeagent-')}")
        return out

    @contextlib.contextmanager
    def held(self, host: Host) -> Iterator[None]:
        """The supervisor leaves the host's processes down while inside (the host is off)."""
        with contextlib.ExitStack() as stack:
            for name in self.processes_on(host):
                stack.enter_context(self.cluster.supervisor.hold(name))
            yield

    def instances_on(self, state: ClusterState, host: Host) -> list[int]:
        nodes = set(self.node_ids_on(host))
        return sorted(
            i for i, r in state.instances.items() if any(m.node_id in nodes for m in r.spec.members)
        )

    def engine_pids(self, state: ClusterState, host: Host | None = None) -> dict[int, int | None]:
        """Engine port -> pid, for every ACTIVE engine (on `host` only, when given)."""
        nodes = set(self.node_ids_on(host)) if host is not None else None
        return {e.port: pid_on(e.port) for e in engines(state) if nodes is None or e.node_id in nodes}

    def snapshot_procs(self) -> dict[str, tuple[int | None, int]]:
        """Supervised name -> (pid, supervisor restarts so far)."""
        out: dict[str, tuple[int | None, int]] = {}
        for ch in self.cluster.children:
            alive = ch.proc is not None and ch.proc.poll() is None
            out[ch.name] = (ch.proc.pid if alive and ch.proc else None, self.cluster.restarts(ch.name))
        servers = self.cluster.nats_servers
        for m in servers.members:
            name = servers.process_name(m)
            out[name] = (servers.server(m.name).pid, self.cluster.restarts(name))
        return out

    def procs_since(self, before: dict[str, tuple[int | None, int]]) -> dict[str, Proc]:
        now = self.snapshot_procs()
        return {
            n: Proc(alive=pid is not None, restarts=r - before.get(n, (None, 0))[1],
                    pid_changed=pid != before.get(n, (None, 0))[0])
            for n, (pid, r) in now.items()
        }  # fmt: skip

    async def leader(self) -> str | None:
        """The controller whose /readiness says it leads (its supervised name)."""
        for i, name in enumerate(self.cluster.controller_names()):
            ip = self.cluster.host_of(name).ip
            if (
                await scrape(f"http://{ip}:{self.cluster.ports.controller + i}/readiness", limit=2)
                is not None
            ):
                return name
        return None

    async def leader_changed_since(self, since: float, within: float) -> float | None:
        """When the first `controller.leader_changed` after `since` was announced (None: none came)."""
        deadline = time.monotonic() + within
        while True:
            with contextlib.suppress(Exception):  # the log may be electing a leader of its own
                for e in await self.entries():
                    if e.type == "controller.leader_changed" and e.ts >= since:
                        return e.ts
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.3)

    async def new_log_leader(self, old: str, within: float) -> tuple[StreamPlacement, float | None]:
        """(the placement, when MOTOR had a leader other than `old`), or None when none came in time."""
        t0 = time.time()
        deadline = time.monotonic() + within
        p = await self.placement()
        while p.leader in (None, old):
            if time.monotonic() > deadline:
                return p, None
            await asyncio.sleep(0.2)
            p = await self.placement()
        return p, time.time() - t0

    async def current_again(self, member: str, within: float) -> float | None:
        """When `member` was a current replica (or the leader) of MOTOR again."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            p = await self.placement()
            if p.leader == member or any(r.name == member and r.current for r in p.followers):
                return time.time()
            await asyncio.sleep(0.3)
        return None

    async def serving_again(self, host: Host, within: float) -> float | None:
        """When every coordinator on `host` answered a request again."""
        urls = [f"http://{host.ip}:{self.cluster.ports.coordinator}/v1"]
        deadline = time.monotonic() + within
        for url in urls:
            while not await self.one_ok(url):
                if time.monotonic() > deadline:
                    return None
                await asyncio.sleep(0.2)
        return time.time()

    async def lead_on(self, stream: str, server: str, within: float = 30.0) -> None:
        """Move `stream`'s leadership to `server` (an operator's step-down with a preferred peer)."""
        admin = await connect(self.cluster.client_options("admin"), name="multihost-admin")
        try:
            deadline = time.monotonic() + within
            while (await stream_placement(admin.jetstream(), stream)).leader != server:
                assert time.monotonic() < deadline, f"{stream} never led by {server}"
                body = orjson.dumps({"placement": {"preferred": server}})
                with contextlib.suppress(Exception):
                    await admin.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", body, timeout=5)
                await asyncio.sleep(1.0)
        finally:
            await admin.close()

    async def placement(self) -> StreamPlacement:
        return await stream_placement(self.nc.jetstream(), MOTOR_STREAM)

    # ------------------------------------------------------------------ the log

    async def fold(self, limit: float = 15.0) -> ClusterState | None:
        """A fresh fold of what MOTOR holds now (None while it does not answer)."""
        try:
            async with asyncio.timeout(limit):
                return await snapshot_state(self.nc)
        except Exception:
            return None

    async def wait_until(
        self, what: str, pred: Callable[[ClusterState], bool], within: float
    ) -> ClusterState:
        deadline = time.monotonic() + within
        state: ClusterState | None = None
        while True:
            state = await self.fold()
            if state is not None and pred(state):
                return state
            if time.monotonic() > deadline:
                where = not_active(state) if state is not None else "the log does not answer"
                raise AssertionError(
                    f"timed out after {within:g} s waiting for {what} ({where}); logs in {self.cluster.logs}"
                )
            await asyncio.sleep(0.3)

    async def last_seq(self) -> int:
        info = await self.nc.jetstream().stream_info(MOTOR_STREAM)
        return int(info.state.last_seq)

    async def entries(self, since_seq: int = 0) -> list[Entry]:
        out = []
        async with asyncio.timeout(30):
            async for d in read_deliveries(self.nc, MOTOR_STREAM, Range(start_seq=since_seq or None)):
                out.append(entry(d.seq, d.subject, d.data))
        return out

    async def motor(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The `motor` CLI against this cluster, logged in from its own credentials."""
        return await asyncio.to_thread(
            subprocess.run,
            [*MOTOR, *args, "--nats-url", self.cluster.url, "--root", str(self.cluster.root)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "250"},
        )

    async def ack_audit(self) -> tuple[dict[str, Any] | None, str]:
        """What `motor events acked --json` says of every process's acks."""
        out = await self.motor("events", "acked", str(self.acks), "--json")
        try:
            return json.loads(out.stdout), ""
        except json.JSONDecodeError:
            return None, (out.stderr or out.stdout).strip()[-300:]

    # ------------------------------------------------------------------ traffic

    def load(self, *, retry: bool) -> LoadGen:
        return LoadGen(
            self.coordinator_urls, clients=6, retry_connection_errors=retry, timeout=CLIENT_TIMEOUT
        )

    async def one_ok(self, url: str) -> bool:

        spec = SPECS[1]
        out = Outcome(spec.key, -1, spec.stream, time.time())
        client = openai.AsyncOpenAI(base_url=url, api_key="none", max_retries=0, timeout=CLIENT_TIMEOUT)
        try:
            await run_one(client, spec, out)
        finally:
            await client.close()
        return out.ok

    async def wait_serving(self, within: float) -> None:
        deadline = time.monotonic() + within
        for url in self.coordinator_urls:
            while not await self.one_ok(url):
                assert time.monotonic() < deadline, f"{url} did not serve within {within:g} s"
                await asyncio.sleep(0.3)

    async def routes_to_all(self, load: LoadGen | None, within: float) -> tuple[bool, list[str]]:
        """Requests through the coordinators reach every engine of every ACTIVE instance in time."""
        from tests.chaos.fleet import probe

        deadline = time.monotonic() + within
        missing: list[str] = ["(not every instance ACTIVE)"]
        while time.monotonic() < deadline:
            state = await self.fold()
            if state is None or not converged(state):
                await asyncio.sleep(0.3)
                continue
            eps = engines(state)
            before = {e: await served(e) for e in eps}
            for url in self.coordinator_urls:
                await probe(url, load, n=8)
            after = {e: await served(e) for e in eps}
            missing = [e.label for e in eps if after[e] <= before[e]]
            if not missing:
                return True, []
        return False, missing

    async def converge(self, since: float, within: float, load: LoadGen | None) -> tuple[float | None, str]:
        """Seconds from `since` until every instance is ACTIVE and served (or None, and why not)."""
        try:
            await self.wait_until("every instance ACTIVE", converged, max(1.0, since + within - time.time()))
        except AssertionError as exc:
            return None, str(exc)
        ok, missing = await self.routes_to_all(load, max(1.0, since + within - time.time()))
        if not ok:
            return None, "no request reached " + ", ".join(missing)
        return time.time() - since, ""
