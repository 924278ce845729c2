"""One simulated cluster: the memory log's server, the network, two controllers, the nodes.

Everything the run draws comes from its seed (`rng_for(what)`: one generator per purpose, so
adding a fault kind does not shift every other draw). `truth()` folds MOTOR straight from the
server, as `motor replay` would, and `serving(...)` asks the machines whether an engine really
answers: the two views the invariants compare.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from core.codec import decode
from core.config import ClusterConfig
from core.errors import DecodeError
from core.events import InstanceState, Role
from core.reducer import apply
from core.state import ClusterState
from streams.definitions import MOTOR_STREAM
from streams.memory import MemoryServer
from streams.memory.store import Stored
from tests.sim.coordinator import SimCoordinator
from tests.sim.loop import SimLoop
from tests.sim.network import Network
from tests.sim.procs import SimAgent, SimController, SimProcess

ROLES = (Role.UNION, Role.PREFILL, Role.DECODE)


@dataclass(frozen=True, slots=True)
class Note:
    """Something the schedule did, or the world saw, at a virtual time."""

    at: float
    text: str


class TruthFold:
    """MOTOR folded as it is on the server now (a lost log folds again from what it holds)."""

    def __init__(self, server: MemoryServer) -> None:
        self.server = server
        self.state = ClusterState()
        self._created = ""
        self._seq = 0
        self._first = 0  # the first sequence folded: a purge (or a rewind) takes it away

    def current(self) -> ClusterState:
        s = self.server.streams.get(MOTOR_STREAM)
        if s is None:
            return self.state
        gone = bool(self._first) and s.get(self._first) is None
        if s.created != self._created or s.last_seq < self._seq or gone:
            self.state, self._created, self._seq, self._first = ClusterState(), s.created, 0, 0
        for m in s.after(self._seq, None):
            self._fold(m)
        return self.state

    def _fold(self, m: Stored) -> None:
        self._seq = m.seq
        self._first = self._first or m.seq
        try:
            self.state = apply(self.state, decode(m.data, m.subject), m.seq)
        except (DecodeError, Exception):  # poison: skipped here as every fold skips it
            return


class World:
    """The cluster of one run."""

    def __init__(
        self, seed: int, cfg: ClusterConfig, directory: Path, loop: SimLoop, *, spares: int = 1
    ) -> None:
        self.seed = seed
        self.cfg = cfg
        self.loop = loop
        self.dir = directory
        self.net = Network(loop, self.rng_for("network"))
        self.server = MemoryServer(clock=loop.wall, context=self.net.context)
        self.pids = [100_000]
        self.notes: list[Note] = []
        self.controllers = {cid: SimController(self, cid) for cid in ("c1", "c2")}
        self.nodes: dict[str, SimAgent] = {}
        n = 0
        for role in ROLES:
            section = cfg.section(role)
            if section is None:
                continue
            for i in range(section.instances * section.nodes_per_instance() + spares):
                n += 1
                node_id = f"{role.value}-{i}"
                self.nodes[node_id] = SimAgent(self, node_id, role, f"10.0.0.{n}")
        self.coordinator = SimCoordinator(self)
        self.truth = TruthFold(self.server)
        self.silences: dict[str, list[tuple[float, float]]] = {}  # process -> (from, to), loop time
        self.poisoned = 0
        self.lost_logs = 0

    def rng_for(self, what: str) -> random.Random:
        """The generator of one purpose, from the seed (a str seed hashes the same everywhere)."""
        return random.Random(f"{self.seed}/{what}")

    def note(self, text: str) -> None:
        self.notes.append(Note(self.loop.time(), text))

    def silent(self, p: SimProcess, seconds: float) -> None:
        """`p` cannot be heard from now on for `seconds` (a fault of its own)."""
        now = self.loop.time()
        self.silences.setdefault(p.name, []).append((now, now + seconds))

    def was_silent(self, name: str, start: float, end: float, slack: float) -> bool:
        """Whether a fault of `name`'s own kept it quiet at some time in [start, end]."""
        return any(a <= end and b + slack >= start for a, b in self.silences.get(name, ()))

    def log_lost(self) -> None:
        self.lost_logs += 1
        self.note("MOTOR lost what was folded")

    def processes(self) -> Iterator[SimProcess]:
        yield from self.controllers.values()
        yield from self.nodes.values()
        yield self.coordinator

    def start(self) -> None:
        self.server.ensure_streams(self.cfg.nats, lease_ttl=self.cfg.controller.lease_ttl)
        for p in self.processes():
            p.start()

    def leader(self) -> SimController | None:
        for c in self.controllers.values():
            if c.leader:
                return c
        return None

    # ------------------------------------------------------------------ the two views

    def serving(self, node_id: str, port: int) -> bool:
        """Whether the engine on that node and port answers requests now (ground truth)."""
        node = self.nodes.get(node_id)
        e = node.machine.by_port(port) if node is not None else None
        return e is not None and e.serving

    def converged(self) -> list[str]:
        """What is missing for every instance of the log (but the terminated) to be ACTIVE with
        its endpoints READY and its engines really answering, and for every role to have as many
        as the config asks ([] when nothing is)."""
        state = self.truth.current()
        missing = []
        for role in ROLES:
            section = self.cfg.section(role)
            if section is None:
                continue
            live, seen = 0, []
            for iid, inst in sorted(state.instances.items()):
                if inst.spec.role != role or inst.state == InstanceState.TERMINATED:
                    continue
                whole = inst.state == InstanceState.ACTIVE and all(
                    self._member_serving(state, m.node_id, [e.business_port for e in m.endpoints])
                    for m in inst.spec.members
                )
                live += whole
                if not whole:
                    seen.append(f"{iid} {inst.state.value}")
            if seen or live < section.instances:
                missing.append(
                    f"{role.value}: {live} of {section.instances} whole"
                    + (f"; {', '.join(seen)}" if seen else "")
                )
        return missing

    def _member_serving(self, state: ClusterState, node_id: str, ports: list[int]) -> bool:
        node = state.nodes.get(node_id)
        return node is not None and node.all_ready() and all(self.serving(node_id, p) for p in ports)
