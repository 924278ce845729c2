"""Fault schedules: what a seed does to the cluster, and when.

`plan(seed)` draws one to four faults at offsets into the fault window; each names its kind,
when it starts, how long it lasts and a parameter. Targets are chosen when the fault fires
(the leader, a node running an engine), from the seed's generator, so a schedule reads the
same every time and means the same thing in every run of it. Every fault heals: a crashed
process is started again by the supervisor, a frozen one thawed, a cut link mended, the log
back. The kinds, with what they stand for:

| kind             | what happens                                                              |
|------------------|---------------------------------------------------------------------------|
| engine_kill      | an engine process SIGKILLed                                               |
| engine_hang      | an engine stops answering (for a while, or for good: it must be replaced) |
| agent_crash      | a node agent SIGKILLed, started again after a moment (engines keep running)|
| agent_freeze     | a node agent SIGSTOPped, then SIGCONTed                                   |
| controller_crash | a controller (mostly the leader) SIGKILLed, started again                 |
| controller_freeze| a controller (mostly the leader) SIGSTOPped, then SIGCONTed               |
| log_outage       | the log's server away for everyone                                        |
| partition        | one process cut off the server                                            |
| slow_link        | one process's trips take a multiple of their time                         |
| lossy_link       | one process's requests and answers are lost at random (retries, redeliveries) |
| lease_expiry     | the leader's trips outlast its lease while its decisions are in flight    |
| poison           | garbage appended to MOTOR and MOTOR_HB                                    |
| lost_tail        | MOTOR loses its last messages (a server restart that lost them)           |
| purge            | MOTOR purged under the running cluster                                    |
| recreate         | MOTOR deleted and created again                                           |
| clock_step       | a node agent's wall clock stepped an hour back or ahead, then back        |

`clock_step` is drawn from a generator of its own (`{seed}/clock`), on top of the schedule
the other kinds make, so adding it changed no seed's other faults; a stepped node is not
silent, and `nothing_judged_by_outage` holds it to that (issue 24 item 4).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass

from core import subjects
from streams.definitions import MOTOR_STREAM
from tests import placed
from tests.sim.engines import Engine
from tests.sim.procs import SimAgent, SimProcess
from tests.sim.world import World

WINDOW = 40.0  # faults start within this many seconds after the cluster first came up
CLOCK_STEP_SHARE = 0.3  # of the seeds, how many also step a node agent's clock
HOUR = 3600.0

# kind -> weight: how often a drawn fault is of that kind
KINDS: dict[str, int] = {
    "engine_kill": 4,
    "engine_hang": 3,
    "agent_crash": 3,
    "agent_freeze": 2,
    "controller_crash": 3,
    "controller_freeze": 3,
    "log_outage": 3,
    "partition": 3,
    "slow_link": 2,
    "lossy_link": 2,
    "lease_expiry": 3,
    "poison": 2,
    "lost_tail": 2,
    "purge": 1,
    "recreate": 1,
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault of a schedule."""

    kind: str
    at: float  # seconds after the cluster first came up
    lasts: float  # seconds until it heals (0: an instant)
    pick: float  # in [0, 1): which target, drawn once so the schedule is data
    param: float  # kind-specific: a latency factor, a loss rate, a count

    def describe(self) -> str:
        lasting = f" for {self.lasts:.1f}s" if self.lasts else ""
        return f"+{self.at:.1f}s {self.kind}{lasting}"


def plan(seed: int) -> list[Fault]:
    """The schedule of a seed."""
    rng = random.Random(f"{seed}/schedule")
    kinds, weights = zip(*KINDS.items(), strict=True)
    out = []
    for _ in range(rng.randint(1, 4)):
        kind = rng.choices(kinds, weights)[0]
        lasts = _duration(kind, rng)
        out.append(Fault(kind, round(rng.uniform(0.0, WINDOW), 3), lasts, rng.random(), rng.random()))
    clock = random.Random(f"{seed}/clock")
    if clock.random() < CLOCK_STEP_SHARE:
        at, lasts = round(clock.uniform(0.0, WINDOW), 3), round(clock.uniform(5.0, 60.0), 3)
        out.append(Fault("clock_step", at, lasts, clock.random(), clock.random()))
    return sorted(out, key=lambda f: f.at)


def _duration(kind: str, rng: random.Random) -> float:
    match kind:
        case "engine_kill" | "poison" | "purge" | "recreate":
            return 0.0
        case "engine_hang":
            return float("inf") if rng.random() < 0.25 else round(rng.uniform(2.0, 25.0), 3)
        case "agent_crash" | "controller_crash":
            return round(rng.uniform(0.5, 5.0), 3)  # until the supervisor starts it again
        case "lost_tail":
            return round(rng.uniform(0.5, 3.0), 3)  # the server restart's outage
        case _:
            return round(rng.uniform(1.0, 30.0), 3)


def ends(f: Fault) -> float:
    """When the fault has healed (an endless hang: when its engine is replaced, not known here)."""
    return f.at + (f.lasts if f.lasts != float("inf") else 0.0)


# --------------------------------------------------------------------------- playing


def _choose(items: list[SimProcess], pick: float) -> SimProcess | None:
    return items[int(pick * len(items))] if items else None


async def play(world: World, faults: list[Fault], origin: float) -> None:
    """Fire every fault of the schedule at its time (virtual seconds after `origin`)."""
    loop = world.loop
    for f in faults:
        await asyncio.sleep(max(0.0, origin + f.at - loop.time()))
        world.note(f"fault {f.describe()}")
        FIRE[f.kind](world, f)


def _later(world: World, seconds: float, fn: Callable[[], None]) -> None:
    if seconds != float("inf"):
        world.loop.call_later(seconds, fn, context=world.net.context)


def _restart(world: World, p: SimProcess, after: float) -> None:
    def again() -> None:
        world.note(f"{p.name} started again")
        p.start()

    _later(world, after, again)


def _engine(world: World, f: Fault) -> tuple[SimAgent, Engine] | None:
    hosts = [(n, e) for n in world.nodes.values() for e in n.machine.live()]
    return hosts[int(f.pick * len(hosts))] if hosts else None


def _engine_kill(world: World, f: Fault) -> None:
    hit = _engine(world, f)
    if hit is not None:
        node, e = hit
        world.note(f"engine pid {e.pid} on {node.name} killed")
        e.kill()


def _engine_hang(world: World, f: Fault) -> None:
    hit = _engine(world, f)
    if hit is not None:
        node, e = hit
        world.note(f"engine pid {e.pid} on {node.name} hangs for {f.lasts:g}s")
        e.hang(f.lasts)


def _crash(world: World, p: SimProcess | None, f: Fault) -> None:
    if p is not None and p.running:
        p.crash()
        world.silent(p, f.lasts)
        _restart(world, p, f.lasts)


def _freeze(world: World, p: SimProcess | None, f: Fault) -> None:
    if p is not None and p.running and not p.frozen:
        p.freeze()
        world.silent(p, f.lasts)
        _later(world, f.lasts, p.thaw)


def _controller(world: World, f: Fault) -> SimProcess | None:
    leader = world.leader()
    if leader is not None and f.param < 0.7:
        return leader
    return _choose(list(world.controllers.values()), f.pick)


def _any_process(world: World, f: Fault) -> SimProcess | None:
    return _choose([p for p in world.processes() if p.running], f.pick)


def _link_fault(
    world: World, f: Fault, set_on: Callable[[SimProcess], None], set_off: Callable[[SimProcess], None]
) -> None:
    p = _any_process(world, f)
    if p is None or p.link is None:
        return
    link = p.link
    set_on(p)
    world.note(f"{f.kind} on {p.name} for {f.lasts:g}s")
    world.silent(p, f.lasts)

    def heal() -> None:
        if p.link is link:
            set_off(p)

    _later(world, f.lasts, heal)


def _partition(world: World, f: Fault) -> None:
    _link_fault(world, f, lambda p: p.link.set_cut(True), lambda p: p.link.set_cut(False))  # type: ignore[union-attr]


def _slow(world: World, f: Fault) -> None:
    factor = 100 + 1400 * f.param  # a 1 ms trip takes 0.1 to 1.5 s

    def on(p: SimProcess) -> None:
        p.link.slow = factor  # type: ignore[union-attr]

    def off(p: SimProcess) -> None:
        p.link.slow = 1.0  # type: ignore[union-attr]

    _link_fault(world, f, on, off)


def _lossy(world: World, f: Fault) -> None:
    loss = 0.2 + 0.4 * f.param

    def on(p: SimProcess) -> None:
        p.link.loss = loss  # type: ignore[union-attr]

    def off(p: SimProcess) -> None:
        p.link.loss = 0.0  # type: ignore[union-attr]

    _link_fault(world, f, on, off)


def _lease_expiry(world: World, f: Fault) -> None:
    leader = world.leader()
    if leader is None or leader.link is None:
        return
    link = leader.link
    ttl = world.cfg.controller.lease_ttl
    hi = world.net.latency[1]
    link.slow = 1.5 * ttl / hi  # every trip, a decision's too, outlasts the lease
    world.note(f"lease_expiry: {leader.name}'s trips take {1.5 * ttl:g}s for {3 * ttl:g}s")
    world.silent(leader, 3 * ttl)

    def heal() -> None:
        link.slow = 1.0

    _later(world, 3 * ttl, heal)


def _log_outage(world: World, f: Fault) -> None:
    if f.param < 0.5:  # the server process restarted (else: the network to it was down)
        world.server.restart()
    world.net.set_outage(True)
    _later(world, f.lasts, lambda: world.net.set_outage(False))


def _poison(world: World, f: Fault) -> None:
    rng = world.rng_for(f"poison/{f.at}")
    node = rng.choice(sorted(world.nodes))
    garbage = [
        b"not json at all",
        b'{"type": "node.registered", "id": "x"}',
        b'{"type": "no.such.event", "id": "y", "ts": 1.0, "source": "rogue", "data": {}}',
    ]
    for raw in rng.sample(garbage, k=1 + int(f.param * 2.99)):
        world.server.inject(placed.endpoint(node), raw)
    world.server.inject(subjects.heartbeat(node), garbage[0])
    world.poisoned += 1


def _lost_tail(world: World, f: Fault) -> None:
    count = 1 + int(f.param * 10)
    world.net.set_outage(True)  # the server restarts
    world.server.restart()
    lost = world.server.rewind(MOTOR_STREAM, count)
    world.note(f"MOTOR lost its tail: seqs {lost[:1]}..{lost[-1:]}")
    world.log_lost()
    _later(world, f.lasts, lambda: world.net.set_outage(False))


def _purge(world: World, f: Fault) -> None:
    world.server.purge(MOTOR_STREAM)
    world.log_lost()


def _recreate(world: World, f: Fault) -> None:
    world.server.recreate(MOTOR_STREAM)
    world.log_lost()


def _clock_step(world: World, f: Fault) -> None:
    """A node's wall clock steps an hour back or ahead (`param`), and back after `lasts`: its
    heartbeats' `ts` say so, and nothing may be judged by it."""
    node = _choose(list(world.nodes.values()), f.pick)
    if not isinstance(node, SimAgent):
        return
    node.skew = HOUR if f.param < 0.5 else -HOUR
    world.note(f"{node.name}'s clock stepped {node.skew:+.0f}s for {f.lasts:g}s")

    def back() -> None:
        node.skew = 0.0
        world.note(f"{node.name}'s clock right again")

    _later(world, f.lasts, back)


FIRE: dict[str, Callable[[World, Fault], None]] = {
    "engine_kill": _engine_kill,
    "engine_hang": _engine_hang,
    "agent_crash": lambda w, f: _crash(w, _choose(list(w.nodes.values()), f.pick), f),
    "agent_freeze": lambda w, f: _freeze(w, _choose(list(w.nodes.values()), f.pick), f),
    "controller_crash": lambda w, f: _crash(w, _controller(w, f), f),
    "controller_freeze": lambda w, f: _freeze(w, _controller(w, f), f),
    "log_outage": _log_outage,
    "partition": _partition,
    "slow_link": _slow,
    "lossy_link": _lossy,
    "lease_expiry": _lease_expiry,
    "poison": _poison,
    "lost_tail": _lost_tail,
    "purge": _purge,
    "recreate": _recreate,
    "clock_step": _clock_step,
}
