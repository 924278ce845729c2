"""A fleet of simulated node agents in one process: real NATS clients, no engine processes.

Each `SimNode` is its own NATS connection and speaks the node agent's protocol with the node
agent's own parts: the registration `nodeagent.registration` builds, a durable command
consumer on `motor.cmd.<node>.>` (`nodeagent.commands.CommandConsumer`: a command is acked
only after its answer is in the log), the command checks and answers of
`nodeagent.command_handler`, one ordered `nodeagent.outbox.Outbox` per node, and a heartbeat on
`motor.hb.<node>` every `nodeagent.heartbeat_interval` with each endpoint's status and load.
What it leaves out is the engine: a start is answered at once, its endpoints go STARTING then
READY with a pid no process has (above Linux's pid_max), and the load is an idle engine's.

`python -m tests.fleetsim --nats-url URL --config FILE --first K --count N` runs nodes K..K+N-1
of the config's plan (`fleet_plan`) until SIGTERM; `--wait-go` holds them until a line arrives
on stdin, so a bench can start the clock after interpreter start-up. It prints `ready N` and
then `registered N in S s`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from nats.aio.client import Client
from nats.errors import Error as NatsError

from core.config import ClusterConfig
from core.configfile import parse_config
from core.errors import ConfigError
from core.events import (
    EndpointLoad,
    EndpointSpec,
    EndpointStatus,
    EndpointStatusChanged,
    EndpointStatusChangedData,
    EventBase,
    Heartbeat,
    HeartbeatData,
    NodeRegistered,
    NodeRegisteredData,
    Role,
    StartCommand,
)
from core.ids import new_id
from nodeagent.backends import backend_for
from nodeagent.command_handler import answer, check_start, check_term
from nodeagent.commands import Command, CommandConsumer
from nodeagent.errors import CommandRefusal, Refusal
from nodeagent.loadmetrics import Load
from nodeagent.metrics import AgentMetrics
from nodeagent.outbox import Outbox
from nodeagent.registration import build_registration
from nodeagent.runstate import Outcome
from nodeagent.settings import AgentSettings
from streams.connection import connect
from streams.definitions import ensure_streams
from streams.errors import StreamsError
from streams.jetstream import JetStreamLog
from streams.publisher import Publisher
from streams.retry import until_done

log = logging.getLogger(__name__)

ROLES = (Role.UNION, Role.PREFILL, Role.DECODE)
# Pids this high name no process on Linux (pid_max is at most 2**22): no engine runs here.
FAKE_PID_BASE = 1 << 23
ENGINE_PORT = 9000


@dataclass(frozen=True, slots=True)
class NodePlan:
    """One simulated node: its index in the fleet, id, role and pod IP."""

    index: int
    node_id: str
    role: Role
    ip: str


def fleet_size(cfg: ClusterConfig) -> int:
    """Nodes the config's instances need in all."""
    return sum(sec.instances * sec.nodes_per_instance() for sec in cfg.sections().values())


def fleet_plan(cfg: ClusterConfig) -> list[NodePlan]:
    """Every node the config's instances need, union first, then prefill, then decode.

    Each node has a loopback address of its own (the whole of 127/8 is local on Linux), so
    every endpoint is `<its ip>:9000` as on a real fleet, and a connection to one is refused
    at once: nothing listens there.
    """
    out: list[NodePlan] = []
    for role in ROLES:
        sec = cfg.section(role)
        if sec is None:
            continue
        for _ in range(sec.instances * sec.nodes_per_instance()):
            i = len(out)
            ip = f"127.{1 + i // 62500}.{(i // 250) % 250}.{i % 250 + 1}"
            out.append(NodePlan(i, f"sim-{i:05d}", role, ip))
    return out


class SimNode:
    """One simulated node agent: its own NATS connection, consumer, outbox and heartbeats."""

    def __init__(self, cfg: ClusterConfig, plan: NodePlan, nats_url: str) -> None:
        self.plan = plan
        self.node_id = plan.node_id
        self.settings = AgentSettings(
            config=cfg,
            node_id=plan.node_id,
            role=plan.role,
            ip=plan.ip,
            engine_port_base=ENGINE_PORT,
            job_name=cfg.nodeagent.job_name,
            nats_urls=[nats_url],
        )
        self.source = f"nodeagent/{plan.node_id}"
        self.metrics = AgentMetrics(plan.node_id)
        self.registration: NodeRegisteredData = build_registration(self.settings)
        self.capacity = backend_for(self.settings.section.engine_type).capacity(self.settings.section)
        self.term = 0
        self.instance_id: int | None = None
        self.running: dict[int, int] = {}  # endpoint id -> pid of its (simulated) engine
        self.outcomes: dict[str, Outcome] = {}  # command id -> how it was answered
        self.starts = 0
        self.heartbeats_sent = 0
        self.heartbeat_failures = 0
        self._nc: Client | None = None
        self._outbox: Outbox | None = None
        self._consumer: CommandConsumer | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def outbox(self) -> Outbox:
        assert self._outbox is not None
        return self._outbox

    def _event(self, cls: type[EventBase], data: object) -> EventBase:
        return cls(id=new_id(), ts=time.time(), source=self.source, data=data)  # type: ignore[call-arg]

    async def start(self) -> None:
        """Connect, bind the command consumer, register, and begin heartbeating, as the agent
        does (`nodeagent.agent`: each start-up step tried until NATS answers)."""
        s = self.settings
        nc = self._nc = await connect(s.nats_urls or [], name=f"nodeagent-{self.node_id}", retry_initial=True)
        js = nc.jetstream()

        async def streams() -> None:
            await ensure_streams(js, s.config.nats, lease_ttl=s.config.controller.lease_ttl, update=False)

        await until_done("create the streams", streams, log)
        self._outbox = Outbox(Publisher(js), self.metrics)
        self._outbox.start()
        consumer = self._consumer = CommandConsumer(
            JetStreamLog(nc),
            self.node_id,
            self.handle,
            self.refuse,
            self.metrics,
            attempts=s.config.nodeagent.command_attempts,
            retry_delay=s.config.nodeagent.command_retry_delay,
        )
        await until_done("bind the command consumer", consumer.subscribe, log)
        await self.outbox.send(self._event(NodeRegistered, self.registration))
        self._tasks = [
            asyncio.create_task(consumer.run(), name=f"{self.node_id}-commands"),
            asyncio.create_task(self._heartbeats(nc), name=f"{self.node_id}-heartbeats"),
        ]

    # ------------------------------------------------------------------ commands

    async def handle(self, cmd: Command, seq: int) -> None:
        """Answer a command once (a redelivered one is answered the same way again)."""
        d = cmd.data
        prior = self.outcomes.get(d.command_id)
        if prior is not None:
            await self.outbox.send(answer(self.node_id, self.source, cmd, prior))
            return
        outcome: Outcome = "applied"
        changes: list[tuple[int, EndpointStatus, int]] = []
        try:
            check_term(d.term, self.term)
            self.term = max(self.term, d.term)
            if isinstance(cmd, StartCommand):
                changes = self._start(cmd)
            else:
                changes = self._stop(cmd.data.node_id, cmd.data.instance_id, cmd.data.endpoint_ids)
        except CommandRefusal as r:
            outcome = r.refusal
        # The agent's order: a spawned engine is STARTING before the start's answer, and READY
        # once its health check passes, after it.
        for ep, status, pid in changes:
            if status != EndpointStatus.READY:
                self._status(ep, status, pid, None)
        await self.outbox.send(answer(self.node_id, self.source, cmd, outcome))
        self.outcomes[d.command_id] = outcome
        for ep, status, pid in changes:
            if status == EndpointStatus.READY:
                self._status(ep, status, pid, EndpointStatus.STARTING)

    async def refuse(self, cmd: Command, refusal: Refusal) -> None:
        """Answer a command that could not be handled with `command.refused` (and remember it)."""
        await self.outbox.send(answer(self.node_id, self.source, cmd, refusal))
        self.outcomes[cmd.data.command_id] = refusal

    def _start(self, cmd: StartCommand) -> list[tuple[int, EndpointStatus, int]]:
        d = cmd.data
        check_start(
            d,
            node_id=self.node_id,
            job_name=self.registration.job_name,
            role=self.plan.role,
            engine_type=self.registration.engine_type,
            registered=self.registration.endpoints,
        )
        if self.running and self.instance_id != d.instance_id:
            raise CommandRefusal("busy", f"node runs instance {self.instance_id}; stop it first")
        self.instance_id = d.instance_id
        out: list[tuple[int, EndpointStatus, int]] = []
        for e in d.endpoints:
            if e.id in self.running:
                continue
            self.starts += 1
            pid = FAKE_PID_BASE + self.plan.index * 1000 + self.starts
            self.running[e.id] = pid
            out += [(e.id, EndpointStatus.STARTING, pid), (e.id, EndpointStatus.READY, pid)]
        return out

    def _stop(
        self, node_id: str, instance_id: int | None, endpoint_ids: tuple[int, ...]
    ) -> list[tuple[int, EndpointStatus, int]]:
        if node_id != self.node_id:
            raise CommandRefusal("wrong_node", f"command is for node {node_id!r}, this is {self.node_id!r}")
        if instance_id is not None and self.instance_id is not None and instance_id != self.instance_id:
            return []
        ids = endpoint_ids or tuple(self.running)
        out = [(e, EndpointStatus.STOPPED, self.running.pop(e)) for e in ids if e in self.running]
        if not self.running:
            self.instance_id = None
        return out

    def _status(self, ep: int, status: EndpointStatus, pid: int, previous: EndpointStatus | None) -> None:
        reason = {
            EndpointStatus.STARTING: f"engine pid {pid} started (simulated)",
            EndpointStatus.READY: "health check passed (simulated)",
        }.get(status, "stopped by command")
        data = EndpointStatusChangedData(
            node_id=self.node_id,
            endpoint_id=ep,
            instance_id=self.instance_id,
            status=status,
            previous=previous,
            reason=reason,
            pid=pid,
        )
        self.outbox.post(self._event(EndpointStatusChanged, data))

    # ------------------------------------------------------------------ heartbeats

    def heartbeat(self) -> HeartbeatData:
        """This node's heartbeat now: every running endpoint READY with an idle engine's load."""
        idle, cap = Load(), self.capacity
        eps = tuple(
            EndpointLoad(
                id=e,
                status=EndpointStatus.READY,
                avail_slots=idle.avail_slots(cap),
                avail_blocks=idle.avail_blocks(cap),
            )
            for e in sorted(self.running)
        )
        return HeartbeatData(node_id=self.node_id, instance_id=self.instance_id, endpoints=eps)

    async def _heartbeats(self, nc: Client) -> None:
        interval = self.settings.heartbeat_interval
        # As the agent's: a beat waits for its ack at most two intervals.
        publisher = Publisher(nc.jetstream(), ack_timeout=max(1.0, 2 * interval))
        # Real nodes do not beat in step: each starts at its own phase of the interval.
        await asyncio.sleep(random.random() * interval)
        while True:
            started = time.monotonic()
            if nc.is_connected:
                hb = Heartbeat(id=new_id(), ts=time.time(), source=self.source, data=self.heartbeat())
                try:
                    await publisher.publish(hb)
                    self.heartbeats_sent += 1
                except (StreamsError, NatsError, OSError):
                    self.heartbeat_failures += 1
            await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))

    async def close(self) -> None:
        """Stop the parts and close the connection (no deregistration: as if the node vanished)."""
        if self._consumer is not None:
            self._consumer.stop()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._outbox is not None:
            await self._outbox.close()
        if self._consumer is not None:
            await self._consumer.close()
        if self._nc is not None:
            with contextlib.suppress(Exception):
                await self._nc.close()


class Fleet:
    """Simulated nodes started together (a cold start: every node boots at once)."""

    def __init__(self, cfg: ClusterConfig, plans: list[NodePlan], nats_url: str) -> None:
        self.nodes = [SimNode(cfg, p, nats_url) for p in plans]

    async def start(self) -> None:
        """Start every node; raise the first failure."""
        await asyncio.gather(*(n.start() for n in self.nodes))

    def endpoints(self) -> list[EndpointSpec]:
        """Every endpoint the fleet registers."""
        return [e for n in self.nodes for e in n.registration.endpoints]

    async def close(self) -> None:
        """Close every node."""
        await asyncio.gather(*(n.close() for n in self.nodes), return_exceptions=True)


def read_config(path: Path) -> ClusterConfig:
    """The cluster config at `path`; ConfigError naming the file when it cannot be read."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the config: {exc.strerror}") from None
    return parse_config(text, str(path))


async def _run(args: argparse.Namespace) -> int:
    cfg = read_config(Path(args.config))
    plan = fleet_plan(cfg)
    plans = plan[args.first : args.first + args.count]
    if len(plans) < args.count:
        raise ConfigError(
            f"--first {args.first} --count {args.count}: the config's instances need {len(plan)} nodes"
        )
    fleet = Fleet(cfg, plans, args.nats_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"ready {len(plans)}", flush=True)
    if args.wait_go:
        await loop.run_in_executor(None, sys.stdin.readline)
    started = time.monotonic()
    try:
        await fleet.start()
        print(f"registered {len(plans)} in {time.monotonic() - started:.2f} s", flush=True)
        await stop.wait()
    finally:
        await fleet.close()
    return 0


def main(argv: list[str]) -> int:
    """Run a slice of the config's fleet until SIGTERM."""
    p = argparse.ArgumentParser(
        prog="python -m tests.fleetsim", description=__doc__.split("\n")[0] if __doc__ else None
    )
    p.add_argument("--nats-url", required=True)
    p.add_argument("--config", required=True, help="the cluster config the controller runs")
    p.add_argument("--first", type=int, default=0, help="index of the first node of the plan to run")
    p.add_argument("--count", type=int, required=True, help="how many nodes of the plan to run")
    p.add_argument("--wait-go", action="store_true", help="start the nodes when a line arrives on stdin")
    args = p.parse_args(argv)
    if args.first < 0:
        p.error(f"--first must be >= 0, got {args.first}")
    if args.count < 1:
        p.error(f"--count must be >= 1, got {args.count}")
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s fleetsim %(levelname)s %(name)s: %(message)s"
    )
    try:
        return asyncio.run(_run(args))
    except ConfigError as exc:
        print(f"fleetsim: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
