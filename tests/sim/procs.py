"""The simulated processes: the real controller and node agent, each on its own link and `Proc`.

A `SimController` runs `controller.service.ControllerService` (fold, lease, decide, fenced
appender, checkpoints) on a `MemoryLog`; a `SimAgent` runs `nodeagent.agent.NodeAgent` (its
registration, command consumer, handler, heartbeats, resync observer, fault reporter) on a
`MemoryLog` and its node's simulated `Machine`. Both read the simulated clocks. `crash` is
SIGKILL (nothing of the process runs again; its link dies with it, what it had in flight still
arrives), `freeze`/`thaw` is SIGSTOP/SIGCONT, and `start` again is the supervisor's restart: a
new process with the same id (and, for an agent, the same run-state file and machine).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from controller.service import ControllerService
from core.events import Role
from nodeagent.agent import NodeAgent
from nodeagent.settings import AgentSettings
from streams.livefold import LiveFold
from streams.memory import MemoryLog
from tests.sim.engines import Machine
from tests.sim.loop import Proc
from tests.sim.network import SimLink

if TYPE_CHECKING:
    from tests.sim.world import World


class SimProcess:
    """What every simulated process shares: its incarnations, link, and the faults on it."""

    kind = "process"

    def __init__(self, world: World, name: str) -> None:
        self.world = world
        self.name = name
        self.proc: Proc | None = None
        self.link: SimLink | None = None
        self.log: MemoryLog | None = None
        self.incarnation = 0
        self.crashes = 0
        # The root task and what it waits for: asyncio holds tasks weakly, and a task waiting on
        # an event nobody else holds is garbage, collected (and closed) in the middle of the run.
        self.task: asyncio.Task[object] | None = None
        self.stop = asyncio.Event()

    @property
    def running(self) -> bool:
        return self.proc is not None and not self.proc.dead

    @property
    def frozen(self) -> bool:
        return self.proc is not None and self.proc.frozen

    def _begin(self) -> MemoryLog:
        self.incarnation += 1
        self.proc = Proc(f"{self.name}#{self.incarnation}")
        self.link = self.world.net.link(self.proc.name)
        self.log = MemoryLog(self.world.server, self.link, name=self.proc.name)
        return self.log

    def fold(self) -> LiveFold | None:
        """The process's fold of MOTOR, when it has one running."""
        return None

    def crash(self) -> None:
        """SIGKILL."""
        if self.proc is None or self.proc.dead:
            return
        self.crashes += 1
        self.world.loop.kill(self.proc)
        if self.link is not None:
            self.link.close()
        if self.log is not None:
            self.world.server.forget_client(self.log)
        self.world.note(f"{self.name} killed")

    def freeze(self) -> None:
        if self.running:
            self.world.loop.freeze(self.proc)  # type: ignore[arg-type]
            self.world.note(f"{self.name} frozen")

    def thaw(self) -> None:
        if self.proc is not None and self.proc.frozen:
            self.world.loop.thaw(self.proc)
            self.world.note(f"{self.name} thawed")


class SimController(SimProcess):
    """One controller process (leader or standby)."""

    kind = "controller"

    def __init__(self, world: World, cid: str) -> None:
        super().__init__(world, f"controller/{cid}")
        self.id = cid
        self.service: ControllerService | None = None

    def start(self) -> None:
        w = self.world
        log = self._begin()
        self.service = ControllerService(
            w.cfg, controller_id=self.id, clock=w.loop.wall, monotonic=w.loop.time, log=log
        )
        assert self.proc is not None
        self.stop = asyncio.Event()
        self.task = w.loop.spawn(self.proc, self.service.run(self.stop), name=self.proc.name)

    @property
    def leader(self) -> bool:
        return self.running and self.service is not None and self.service.leader

    def fold(self) -> LiveFold | None:
        return self.service.log if self.service is not None else None


class SimAgent(SimProcess):
    """One node: its agent process (restartable) and its machine (which outlives the agent)."""

    kind = "nodeagent"

    def __init__(self, world: World, node_id: str, role: Role, ip: str) -> None:
        super().__init__(world, f"nodeagent/{node_id}")
        self.node_id = node_id
        self.role = role
        self.machine = Machine(node_id, world.rng_for(f"machine/{node_id}"), world.pids)
        self.settings = AgentSettings(
            config=world.cfg,
            node_id=node_id,
            role=role,
            ip=ip,
            port=0,
            log_dir=world.dir / "logs",
            run_dir=world.dir / "run",
        )
        self.agent: NodeAgent | None = None
        self.skew = 0.0  # seconds the node's wall clock is off the simulated one (a clock_step)

    def wall(self) -> float:
        """The node's own wall clock: what its events' `ts` say."""
        return self.world.loop.wall() + self.skew

    def start(self) -> None:
        w = self.world
        log = self._begin()
        self.agent = NodeAgent(
            self.settings, log=log, host=self.machine, http=False, clock=self.wall, monotonic=w.loop.time
        )
        assert self.proc is not None
        self.stop = asyncio.Event()
        self.task = w.loop.spawn(self.proc, self.agent.run(self.stop), name=self.proc.name)

    def fold(self) -> LiveFold | None:
        observer = self.agent._observer if self.agent is not None else None
        return observer.log if observer is not None else None
