"""One seed, start to verdict: bring the cluster up, play the schedule, wait for it to heal,
check every invariant.

Determinism: the loop's virtual time (tests/sim/loop.py), every draw from generators seeded by
`seed` (the schedule, the network, the machines, fresh event ids through `core.ids.ids_from`,
and the process-wide `random` that `streams.retry` jitters with), and string hashing fixed by
PYTHONHASHSEED (the command line sees to it). So a run is a function of its seed, and
`just sim --seed N` replays a failure step for step.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from core.config import ClusterConfig
from core.ids import ids_from
from tests.localcluster import cluster_config
from tests.sim import checks
from tests.sim.faults import Fault, ends, plan, play
from tests.sim.loop import Deadlock, SimLoop
from tests.sim.world import Note, World

BOOT_WITHIN = 60.0  # the cluster first comes up within this (virtual) time
RECOVER_WITHIN = 90.0  # and is whole again this long after the last fault healed
STABLE = 5.0  # whole means whole for this long (a check in flight when a fault healed may flap it once)
SETTLE = 5.0  # then runs on this long before the verdict (folds catch up)
POLL = 0.5
# The shipped check interval; a startup_timeout for engines that load in seconds, not a model's
# half hour (as tests/integration/controller_harness.py's), so a start that hangs is judged.
HEALTH = {"interval": 1.0, "startup_timeout": 30.0}
# Where a run's files go (the node agents' run state, written atomically on every command): in
# memory when the machine has a tmpfs there, so a seed never waits on a disk.
SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def sim_config(*, startup_timeout: float = HEALTH["startup_timeout"]) -> ClusterConfig:
    """The chaos suite's cluster (tests/chaos/harness.py's `chaos_config`: one union instance,
    one 1P1D pair, test-speed liveness, the lease as shipped) with the shipped heartbeat and
    health interval, a startup_timeout of 30 s, checkpoints every 20 events (restarts load
    them), the fault reporter on (an engine hung for good is reported dead and replaced)."""
    return cluster_config(
        controller={
            "lease_ttl": 2.0,
            "restart_reset_after": 3.0,
            "checkpoint_every": 20,
            "tick_interval": 0.5,
        },
        nodeagent={"heartbeat_interval": 1.0, "fault_reporter": True},
        union={"health_check_config": {**HEALTH, "startup_timeout": startup_timeout}},
        prefill={"health_check_config": {**HEALTH, "startup_timeout": startup_timeout}},
        decode={"health_check_config": {**HEALTH, "startup_timeout": startup_timeout}},
    )


@dataclass
class Result:
    """What one seed did and how it was judged."""

    seed: int
    faults: list[Fault]
    checks: list[checks.Check] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    logs: list[logging.LogRecord] = field(default_factory=list)
    virtual: float = 0.0
    real: float = 0.0

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    def failed(self) -> list[checks.Check]:
        return [c for c in self.checks if not c.ok]


class _Capture(logging.Handler):
    """Keeps the run's log records, stamped with virtual time, for the failure report."""

    def __init__(self, loop: SimLoop, level: int) -> None:
        super().__init__(level)
        self.loop = loop
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        record.vt = self.loop.time()
        self.records.append(record)


@contextlib.contextmanager
def _quiet_teardown() -> Iterator[None]:
    # What the closed coroutines' `finally` blocks try cannot run without the loop, and is no
    # finding: the verdict is in. (Every coroutine is closed by `_close_everything`: what the
    # collector finds later can run nothing, so no full collection is paid here.)
    hook = sys.unraisablehook
    sys.unraisablehook = lambda _: None
    try:
        yield
    finally:
        sys.unraisablehook = hook


def _close_everything(loop: SimLoop) -> None:
    """Close every coroutine the run left pending (killed processes', and the living ones'),
    now, with no loop running. Left to the garbage collector they would be closed during the
    next seed's run, and their `finally` blocks would meet that run's loop: one seed's leftovers
    would change another's run."""
    logging.disable(logging.CRITICAL)  # their `finally` blocks' farewells are no news
    try:
        for task in asyncio.all_tasks(loop):
            with contextlib.suppress(BaseException):
                task.get_coro().close()  # type: ignore[union-attr]
    finally:
        logging.disable(logging.NOTSET)


Epilogue = Callable[[World], Awaitable[list[checks.Check]]]


def run_seed(
    seed: int, *, cfg: ClusterConfig | None = None, live_log: bool = False, then: Epilogue | None = None
) -> Result:
    """Run one seed's schedule and judge it; `then` goes on from the verdict with more steps
    and checks of its own (a regression test's)."""
    cfg = cfg or sim_config()
    result = Result(seed, plan(seed))
    loop = SimLoop()
    root = logging.getLogger()
    if root.level > logging.WARNING or root.level == logging.NOTSET:
        root.setLevel(logging.WARNING)
    capture = _Capture(loop, root.level)
    root.addHandler(capture)
    began = time.monotonic()
    random.seed(seed)
    ids = random.Random(f"{seed}/ids")

    def fresh_id() -> str:
        ms = int(loop.wall() * 1000)
        return f"{(ms << 80) | (0x7 << 76) | ids.getrandbits(76):032x}"

    with (
        _quiet_teardown(),
        tempfile.TemporaryDirectory(prefix="motor-sim-", dir=SCRATCH) as tmp,
        ids_from(fresh_id),
    ):
        world = World(seed, cfg, Path(tmp), loop)
        try:
            result.checks = loop.run_until_complete(_main(world, result.faults, then))
        except Deadlock as exc:
            result.checks = [checks.Check("0 the simulation ran", False, f"deadlock: {exc}")]
        finally:
            root.removeHandler(capture)
            result.virtual = loop.time()
            result.notes = world.notes
            result.logs = capture.records
            _close_everything(loop)
            loop.close()
            del world
    result.real = time.monotonic() - began
    if live_log:
        for r in result.logs:
            print(format_record(r))
    return result


async def _main(world: World, faults: list[Fault], then: Epilogue | None = None) -> list[checks.Check]:
    loop = world.loop
    world.start()
    up = await until_converged(world, BOOT_WITHIN)
    if up is None:
        return [
            checks.reconverged(
                None, BOOT_WITHIN, "the cluster never came up: " + "; ".join(world.converged())
            )
        ]
    origin = loop.time()
    world.note("cluster up: the schedule begins")
    await play(world, faults, origin)
    healed = origin + max((ends(f) for f in faults), default=0.0)
    await asyncio.sleep(max(0.0, healed - loop.time()))
    world.note("every fault healed")
    took = await until_converged(world, RECOVER_WITHIN, stable=STABLE)
    why = "; ".join(world.converged()) if took is None else ""
    whole_at = loop.time()
    await asyncio.sleep(SETTLE)
    more = await then(world) if then is not None else []
    es = checks.entries(world)
    return [
        checks.reconverged(took, RECOVER_WITHIN, why),
        checks.one_start_per_incarnation(es),
        checks.reigns_fenced(es),
        checks.nothing_judged_by_outage(world, es),
        checks.verify_agrees(world),
        checks.folds_caught_up(world),
        checks.nothing_failed_on_a_bug(_captured()),
        checks.routes_only_routable(world),
        *([checks.routing_resumes(world, whole_at)] if took is not None else []),
        *more,
    ]


def _captured() -> list[logging.LogRecord]:
    for h in logging.getLogger().handlers:
        if isinstance(h, _Capture):
            return h.records
    return []


async def until_converged(world: World, within: float, *, stable: float = 0.0) -> float | None:
    """Seconds until the cluster is whole and stays so for `stable` seconds (None: not within
    `within`)."""
    loop = world.loop
    began = loop.time()
    since: float | None = None
    while True:
        now = loop.time()
        if world.converged():
            since = None
        elif since is None:
            since = now
        if since is not None and now - since >= stable:
            return since - began
        if now - began >= within + stable:
            return None
        await asyncio.sleep(POLL)


def format_record(r: logging.LogRecord) -> str:
    vt = getattr(r, "vt", 0.0)
    return f"  {vt:9.3f}s {r.levelname:<7} {r.name}: {r.getMessage()}"
