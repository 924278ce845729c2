"""The local cluster launcher behind `motor up` (and the whole-cluster tests).

Starts nats-server (embedded, data under `.motor/`, unless an external URL is given; with
`nats_cluster` N a JetStream cluster of N, `deploy.natscluster`), a controller leader and a standby, one or more coordinator replicas (sharing one port with
`SO_REUSEPORT`) and one node agent per node the config needs, each as its own process with its
log under `.motor/logs/`. Every child carries the marker `MOTOR_UP_SESSION` in its
environment, so `stop()` also finds the engine processes the node agents started in their own
process groups. With `supervise` (the default) a process that exits on its own is started
again with backoff (`deploy.supervise`); `stop()` is deliberate and restarts nothing. A
coordinator replica is also probed on its own Unix socket (`liveness`, `deploy.liveness`) and
killed, to be started again, when it stops answering: frozen, it would keep its share of the
shared port's connections.
Every process runs on a `Host` (`deploy.hosts`): this machine for `motor up`; hosts in
network namespaces for tests/multihost, where `placement` names each process's host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from core.config import ClusterConfig
from core.ids import new_id
from deploy.clusterplan import (
    NodePlan,
    Ports,
    controller_argv,
    coordinator_argv,
    fit_replicas,
    nodeagent_argv,
    plan_nodes,
)
from deploy.hosts import LOCAL, Host
from deploy.liveness import LivenessRule, probe_dir, probe_unix, remove_probe_sockets
from deploy.logcap import DEFAULT_LOG_MAX, start_log_cap, stop_log_cap
from deploy.natscluster import SINGLE, NatsCluster, plan_members
from deploy.natshealth import fit_store
from deploy.supervise import Backoff, Notice, Supervisor, Watch, die_with_parent, wait_popen
from deploy.sweep import session_pids, stop_strays, wait_for_exit
from streams.connection import NatsOptions
from streams.server import EmbeddedNats

if TYPE_CHECKING:
    from deploy.natsauth import ClusterAuth

NATS = SINGLE  # the supervised name of the embedded server (of each member: `nats-n1` …)


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] | None = None  # extra environment, kept for a restart
    host: Host = LOCAL


@dataclass
class LocalCluster:
    cfg: ClusterConfig
    root: Path = Path(".motor")
    ports: Ports = field(default_factory=Ports)
    nats_url: str | None = None  # external server(s), comma-separated; None = start the embedded one
    nats_cluster: int = 1  # embedded servers: 1, or a JetStream cluster of N (routes, replicas N)
    nodes: int | None = None  # node agents to run; None = what the config needs
    standby: bool = True
    coordinators: int = 1  # replicas sharing the coordinator port (SO_REUSEPORT when > 1)
    supervise: bool = True  # restart what exits on its own, with backoff
    backoff: Backoff = field(default_factory=Backoff)
    liveness: LivenessRule = field(default_factory=LivenessRule)  # coordinators, when supervised
    on_notice: Callable[[Notice], None] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    session: str = field(default_factory=lambda: new_id()[:16])
    children: list[Child] = field(default_factory=list)
    hosts: list[Host] = field(default_factory=lambda: [LOCAL])
    # process name (`controller-c1`, `coordinator-2`, `nodeagent-<node>`, `nats-n1`) -> host
    # name; a process not named runs on the first host
    placement: dict[str, str] = field(default_factory=dict)
    # each log under `logs` is cut past this size, the older part kept (deploy.logcap); None: never
    log_max_bytes: int | None = DEFAULT_LOG_MAX

    def __post_init__(self) -> None:
        if self.coordinators < 1:
            raise ValueError(f"coordinators: at least 1, got {self.coordinators}")
        if self.nats_cluster < 1:
            raise ValueError(f"nats cluster: at least 1 server, got {self.nats_cluster}")
        if self.nats_cluster > 1 and self.nats_url is not None:
            raise ValueError("a NATS cluster is started only without an external NATS URL")
        if not self.hosts:
            raise ValueError("hosts: at least one")
        self.cfg = fit_replicas(self.cfg, self.nats_cluster, external=self.nats_url is not None)
        self.root = self.root.resolve()
        self._nats: NatsCluster | None = None
        self._log_cap: asyncio.Task[None] | None = None
        self.auth: ClusterAuth | None = None  # the embedded server's users (deploy.natsauth)
        self.supervisor = Supervisor(self.backoff, self.on_notice, self.liveness)
        self.nats_members = plan_members(
            self.nats_cluster,
            [
                self.host(self.placement.get(f"nats-n{i + 1}", self.hosts[0].name))
                for i in range(self.nats_cluster)
            ],
            port=self.ports.nats,
            monitor_port=self.ports.nats_monitor,
            route_port=self.ports.nats_route,
        )

    def host(self, name: str) -> Host:
        """The host called `name`."""
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no host {name!r} (hosts: {', '.join(h.name for h in self.hosts)})")

    def host_of(self, process: str) -> Host:
        """The host a process runs on."""
        return self.host(self.placement.get(process, self.hosts[0].name))

    # ------------------------------------------------------------------ plan

    def node_plan(self) -> list[NodePlan]:
        """One node agent per node of every instance the config asks for (or `nodes`)."""
        return plan_nodes(self.cfg, self.nodes, self.ports)

    @property
    def url(self) -> str:
        """Every NATS server's URL, comma-separated (what each process is given)."""
        return self.nats_url or ",".join(m.url for m in self.nats_members)

    @property
    def coordinator_url(self) -> str:
        return self.coordinator_urls()[0]

    def coordinator_urls(self) -> list[str]:
        """Where each coordinator replica answers (replicas on one host share one URL)."""
        out: list[str] = []
        for name in self.coordinator_names():
            url = f"http://{self.host_of(name).bind(self.cfg.coordinator.host)}:{self.ports.coordinator}"
            if url not in out:
                out.append(url)
        return out

    @property
    def controller_url(self) -> str:
        name = self.controller_names()[0]
        return f"http://{self.host_of(name).bind(self.cfg.controller.host)}:{self.ports.controller}"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def run_dir(self) -> Path:
        """Where the replicas' probe sockets live (`deploy.liveness.probe_dir`)."""
        return probe_dir(self.root, self.session, self.coordinator_names())

    def probe_socket(self, name: str) -> Path:
        """The Unix socket a coordinator replica answers its liveness probe on."""
        return self.run_dir / f"{name}.sock"

    def coordinator_names(self) -> list[str]:
        """`coordinator`, or `coordinator-1` … `coordinator-N` for N replicas."""
        if self.coordinators == 1:
            return ["coordinator"]
        return [f"coordinator-{k}" for k in range(1, self.coordinators + 1)]

    def controller_names(self) -> list[str]:
        return ["controller-c1", "controller-c2"] if self.standby else ["controller-c1"]

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start NATS and every process; return once all are spawned (not yet ready)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._log_cap = start_log_cap(self.logs, self.log_max_bytes)
        store_cap = None
        if self.nats_url is None:  # the log fit into its disk, before anything runs
            many = self.nats_cluster > 1
            stores = [self.root / "nats" / m.name if many else self.root / "nats" for m in self.nats_members]
            self.cfg, store_cap = fit_store(self.cfg, stores)
        cfg_path = self.root / "cluster.json"
        cfg_path.write_bytes(orjson.dumps(self.cfg.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
        if self.nats_url is None:
            from deploy.natsauth import prepare, route_password

            nodes = [p.node_id for p in self.node_plan()]
            self.auth = await asyncio.to_thread(prepare, self.root, nodes, self.cfg.nats)  # may run openssl
            nats = NatsCluster(
                self.root,
                self.nats_members,
                self.logs,
                extra_conf=self.auth.server_conf(),
                route_password=route_password(self.root) if self.nats_cluster > 1 else None,
                max_file_store=store_cap,
            )
            await nats.start()
            self._nats = nats
            self.auth.write_contexts(self.url)
        await self._ensure_streams()
        common = ["--config", str(cfg_path), "--nats-url", self.url]
        for i, cid in enumerate(["c1", "c2"] if self.standby else ["c1"]):
            name = f"controller-{cid}"
            host = self.host_of(name).bind(self.cfg.controller.host)
            self.spawn(name, controller_argv(common, cid, host, self.ports.controller + i))
        for name in self.coordinator_names():
            host = self.host_of(name).bind(self.cfg.coordinator.host)
            reuse = self.coordinators > 1
            sock = self.probe_socket(name)
            self.spawn(name, coordinator_argv(common, name, host, self.ports.coordinator, sock, reuse))
        for plan in self.node_plan():
            name = f"nodeagent-{plan.node_id}"
            self.spawn(name, nodeagent_argv(common, plan, self.host_of(name).ip, self.logs))
        if self.supervise:
            self._supervise_all()

    async def _ensure_streams(self) -> None:
        from streams.connection import connect
        from streams.definitions import ensure_streams

        nc = await connect(self.client_options("admin"), name="motor-up")
        try:
            await ensure_streams(nc.jetstream(), self.cfg.nats, lease_ttl=self.cfg.controller.lease_ttl)
        finally:
            await nc.close()

    def client_options(self, user: str = "inspect") -> NatsOptions:
        """How a client in this process logs in: as `user` on the embedded server, else as the
        environment says (an external NATS: the operator supplies credentials)."""
        if self.auth is not None:
            return self.auth.options(user, self.url)
        return NatsOptions.from_config(self.cfg.nats, [self.url])

    def spawn(self, name: str, argv: list[str], extra: dict[str, str] | None = None) -> Child:
        """Start the process `name` (`argv`, with `extra` in its environment), its output appended
        to its log."""
        log = self.logs / f"{name}.log"
        host = self.host_of(name)
        env = {
            **os.environ,
            **self.extra_env,
            **(extra or {}),
            "MOTOR_UP_SESSION": self.session,
            "PYTHONUNBUFFERED": "1",
        }
        if self.auth is not None:
            env = self.auth.child_env(env, name)  # its role's credentials, nobody else's
        with log.open("ab") as fh:
            fh.write(f"--- {time.strftime('%H:%M:%S')} starting {name}\n".encode())
            fh.flush()
            proc = subprocess.Popen(
                [*host.prefix(), *argv],
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,  # motor up killed -9 takes its children along
            )
        child = Child(name, argv, log, proc, extra, host)
        self.children.append(child)
        return child

    # ------------------------------------------------------------------ supervision

    def _supervise_all(self) -> None:
        for c in list(self.children):
            self._watch_child(c.name)
        if self._nats is not None:
            for w in self._nats.watches(self.supervisor.notify):  # exits, and a full disk's wedge
                self.supervisor.watch(w)

    def _watch_child(self, name: str) -> None:
        def current() -> object:
            return self.child(name).proc

        async def wait() -> int:
            proc = self.child(name).proc
            assert proc is not None
            return await wait_popen(proc)

        async def respawn() -> None:
            old = self.child(name)
            self.children.remove(old)
            self.spawn(name, old.argv, old.env)

        if name not in self.coordinator_names():
            self.supervisor.watch(Watch(name, current, wait, respawn))
            return
        path = str(self.probe_socket(name))
        timeout = self.liveness.timeout

        async def probe() -> bool:
            return await probe_unix(path, timeout)

        def kill() -> bool:
            proc = self.child(name).proc
            if proc is None or proc.poll() is not None:
                return False
            # SIGKILL: a stopped process gets no other signal, and only its death takes its
            # socket out of the shared port.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return True

        self.supervisor.watch(Watch(name, current, wait, respawn, probe=probe, kill=kill))

    def restarts(self, name: str) -> int:
        """How many times the supervisor restarted the process `name` (a child or `nats-server`)."""
        return self.supervisor.restarts(name)

    @property
    def nats(self) -> EmbeddedNats:
        """The embedded nats-server, the first member of a cluster (a test stops, freezes and
        restarts it on the same store)."""
        return self.nats_servers.server(self.nats_members[0].name)

    @property
    def nats_servers(self) -> NatsCluster:
        """Every embedded nats-server."""
        if self._nats is None:
            raise RuntimeError("this cluster uses an external NATS")
        return self._nats

    def child(self, name: str) -> Child:
        for c in self.children:
            if c.name == name:
                return c
        raise KeyError(name)

    def exited(self) -> list[Child]:
        """Children that have exited and will not be restarted (a crash, shown with its log)."""
        return [
            c
            for c in self.children
            if c.proc is not None and c.proc.poll() is not None and not self._restartable(c.name)
        ]

    def _restartable(self, name: str) -> bool:
        w = self.supervisor.watches.get(name)
        return w is not None and w.supervised and not self.supervisor.stopping

    async def stop(self, grace: float = 10.0) -> int:
        """Stop every process this cluster started, engines included; return how many."""
        await self.supervisor.stop()  # deliberate: nothing is restarted from here on
        procs = [c.proc for c in self.children if c.proc is not None and c.proc.poll() is None]
        # Node agents first (they stop their engines), then the rest.
        order = sorted(
            (c for c in self.children if c.proc is not None and c.proc.poll() is None),
            key=lambda c: 0 if c.name.startswith("nodeagent") else 1,
        )
        for c in order:
            assert c.proc is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c.proc.pid, signal.SIGTERM)
        await asyncio.gather(*(wait_for_exit(p, grace) for p in procs))
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        stray_count = 0
        # Again until none is left: an engine started as its agent stopped shows up later.
        for _ in range(3):
            strays = list(session_pids(self.session))
            if not strays:
                break
            stray_count += len(strays)
            await stop_strays(strays)
        if self._nats is not None:
            await self._nats.stop()
            self._nats = None
        await stop_log_cap(self._log_cap)
        remove_probe_sockets(self.run_dir, self.root, self.coordinator_names())
        return len(procs) + stray_count
