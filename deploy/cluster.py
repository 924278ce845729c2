"""The local cluster launcher behind `motor up` (and the whole-cluster tests).

Starts nats-server (embedded, data under `.motor/`, unless an external URL is given), a
controller leader and a standby, one or more coordinator replicas (sharing one port with
`SO_REUSEPORT`) and one node agent per node the config needs, each as its own process with its
log under `.motor/logs/`. Every child carries the marker `MOTOR_UP_SESSION` in its
environment, so `stop()` also finds the engine processes the node agents started in their own
process groups. With `supervise` (the default) a process that exits on its own is started
again with backoff (`deploy.supervise`); `stop()` is deliberate and restarts nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from core.config import ClusterConfig
from core.events import Role
from core.ids import new_id
from deploy.supervise import Backoff, Notice, Supervisor, Watch, wait_popen
from deploy.sweep import session_pids, stop_strays, wait_for_exit
from streams.connection import NatsOptions
from streams.server import EmbeddedNats

if TYPE_CHECKING:
    from deploy.natsauth import ClusterAuth

NATS = "nats-server"  # the supervised name of the embedded server


@dataclass(frozen=True)
class Ports:
    nats: int = 4222
    nats_monitor: int = 8222
    coordinator: int = 8000
    controller: int = 8100
    nodeagent: int = 8200
    engine: int = 9000
    engine_stride: int = 100  # engine ports of node i: engine + i * stride, one per DP rank


@dataclass(frozen=True)
class NodePlan:
    node_id: str
    role: Role
    port: int
    engine_port_base: int


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] | None = None  # extra environment, kept for a restart


@dataclass
class LocalCluster:
    cfg: ClusterConfig
    root: Path = Path(".motor")
    ports: Ports = field(default_factory=Ports)
    nats_url: str | None = None  # external server; None = start the embedded one
    nodes: int | None = None  # node agents to run; None = what the config needs
    standby: bool = True
    coordinators: int = 1  # replicas sharing the coordinator port (SO_REUSEPORT when > 1)
    supervise: bool = True  # restart what exits on its own, with backoff
    backoff: Backoff = field(default_factory=Backoff)
    on_notice: Callable[[Notice], None] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    session: str = field(default_factory=lambda: new_id()[:16])
    children: list[Child] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.coordinators < 1:
            raise ValueError(f"coordinators: at least 1, got {self.coordinators}")
        self.root = self.root.resolve()
        self._nats: EmbeddedNats | None = None
        self.auth: ClusterAuth | None = None  # the embedded server's users (deploy.natsauth)
        self.supervisor = Supervisor(self.backoff, self.on_notice)

    # ------------------------------------------------------------------ plan

    def node_plan(self) -> list[NodePlan]:
        """One node agent per node of every instance the config asks for (or `nodes`)."""
        wanted: list[Role] = []
        for role, sec in self.cfg.sections().items():
            wanted += [role] * (sec.instances * sec.nodes_per_instance())
        if self.nodes is not None:
            if self.nodes < len(wanted):
                wanted = wanted[: self.nodes]
            else:
                # Spare nodes take the role of the first section: they replace failed nodes.
                wanted += [wanted[0] if wanted else Role.UNION] * (self.nodes - len(wanted))
        plans = []
        counters: dict[Role, int] = {}
        for i, role in enumerate(wanted):
            k = counters.get(role, 0)
            counters[role] = k + 1
            plans.append(
                NodePlan(
                    node_id=f"{role.value}-{k}",
                    role=role,
                    port=self.ports.nodeagent + i,
                    engine_port_base=self.ports.engine + i * self.ports.engine_stride,
                )
            )
        return plans

    @property
    def url(self) -> str:
        return self.nats_url or f"nats://127.0.0.1:{self.ports.nats}"

    @property
    def coordinator_url(self) -> str:
        return f"http://{self.cfg.coordinator.host}:{self.ports.coordinator}"

    @property
    def controller_url(self) -> str:
        return f"http://{self.cfg.controller.host}:{self.ports.controller}"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

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
        cfg_path = self.root / "cluster.json"
        cfg_path.write_bytes(orjson.dumps(self.cfg.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
        if self.nats_url is None:
            from deploy.natsauth import prepare

            nodes = [p.node_id for p in self.node_plan()]
            self.auth = await asyncio.to_thread(prepare, self.root, nodes, self.cfg.nats)  # may run openssl
            nats = EmbeddedNats(
                self.root / "nats",
                port=self.ports.nats,
                monitor_port=self.ports.nats_monitor,
                log_file=self.logs / "nats-server.log",
                extra_conf=self.auth.server_conf(),
            )
            await nats.start()
            self._nats = nats
            self.auth.write_contexts(self.url)
        await self._ensure_streams()
        py = [sys.executable, "-m", "deploy.cli"]
        common = ["--config", str(cfg_path), "--nats-url", self.url]
        ids = ["c1", "c2"] if self.standby else ["c1"]
        for i, cid in enumerate(ids):
            self._spawn(
                f"controller-{cid}",
                [
                    *py,
                    "controller",
                    *common,
                    "--id",
                    cid,
                    "--host",
                    self.cfg.controller.host,
                    "--port",
                    str(self.ports.controller + i),
                ],
            )
        for name in self.coordinator_names():
            reuse = ["--reuse-port"] if self.coordinators > 1 else []
            self._spawn(
                name,
                [
                    *py,
                    "coordinator",
                    *common,
                    "--host",
                    self.cfg.coordinator.host,
                    "--port",
                    str(self.ports.coordinator),
                    "--name",
                    name,
                    *reuse,
                ],
            )
        for plan in self.node_plan():
            self._spawn(
                f"nodeagent-{plan.node_id}",
                [
                    *py,
                    "nodeagent",
                    *common,
                    "--node-id",
                    plan.node_id,
                    "--role",
                    plan.role.value,
                    "--ip",
                    "127.0.0.1",
                    "--port",
                    str(plan.port),
                    "--engine-port-base",
                    str(plan.engine_port_base),
                    "--log-dir",
                    str(self.logs),
                ],
            )
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

    def _spawn(self, name: str, argv: list[str], extra: dict[str, str] | None = None) -> Child:
        log = self.logs / f"{name}.log"
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
                argv,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        child = Child(name, argv, log, proc, extra)
        self.children.append(child)
        return child

    # ------------------------------------------------------------------ supervision

    def _supervise_all(self) -> None:
        for c in list(self.children):
            self._watch_child(c.name)
        nats = self._nats
        if nats is not None:
            self.supervisor.watch(Watch(NATS, lambda: nats.pid, nats.wait, nats.start))

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
            self._spawn(name, old.argv, old.env)

        self.supervisor.watch(Watch(name, current, wait, respawn))

    def restarts(self, name: str) -> int:
        """How many times the supervisor restarted the process `name` (a child or `nats-server`)."""
        return self.supervisor.restarts(name)

    @property
    def nats(self) -> EmbeddedNats:
        """The embedded nats-server (a test stops, freezes and restarts it on the same store)."""
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

    def kill_child(self, name: str, sig: int = signal.SIGKILL) -> None:
        c = self.child(name)
        if c.proc is not None and c.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(c.proc.pid, sig)

    def restart_child(
        self, name: str, *, set_args: dict[str, str] | None = None, env: dict[str, str] | None = None
    ) -> Child:
        """Start a child again, optionally with some flags changed (`{"--ip": "127.0.0.2"}`)."""
        c = self.child(name)
        self.children.remove(c)
        argv = list(c.argv)
        for flag, value in (set_args or {}).items():
            if flag in argv:
                argv[argv.index(flag) + 1] = value
            else:
                argv += [flag, value]
        return self._spawn(name, argv, env)

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
        # Again until none is left: an engine a node agent was starting as it stopped shows
        # up only after the first sweep.
        for _ in range(3):
            strays = list(session_pids(self.session))
            if not strays:
                break
            stray_count += len(strays)
            await stop_strays(strays)
        if self._nats is not None:
            await self._nats.stop()
            self._nats = None
        return len(procs) + stray_count
