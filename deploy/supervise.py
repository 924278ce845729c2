"""Supervision for `motor up`: a process that exits on its own is started again, with backoff.

`Backoff` is the pure rule (0.5 s doubling to 10 s; a process that stayed up `stable_after`
seconds starts the next streak from the beginning). `Supervisor` runs one task per watched
process: it awaits the exit, waits the backoff and respawns. A deliberate stop (`stop()`)
restarts nothing; a held process (`hold(name)`) is left alone until released, so a test can
kill something and bring it back itself; a process replaced while the supervisor waited
(a holder's own restart, `LocalCluster.spawn`) is followed instead of restarted.

A watch with a `probe` is also asked whether it answers (`deploy.liveness`): a process that
stops answering is killed, its exit restarts it as any other. Exits alone miss a process that
is frozen or wedged, and one that shares a port swallows connections meanwhile. A nats-server
whose store hit a write error (a full disk) lives and answers, but takes no publish until it
is restarted: its probe is that error (`deploy.natshealth`), and its notice says "wedged".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

from deploy.liveness import LivenessRule, Probing, Verdict

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Backoff:
    """Restart delays: `initial` doubling (`factor`) up to `maximum`; reset after a stable run."""

    initial: float = 0.5
    factor: float = 2.0
    maximum: float = 10.0
    stable_after: float = 30.0

    def next(self, streak: int, uptime: float) -> tuple[float, int]:
        """(delay before the restart, new streak) for a process that ran `uptime` s and exited."""
        if uptime >= self.stable_after:
            streak = 0
        return min(self.initial * self.factor**streak, self.maximum), streak + 1


@dataclass(frozen=True, slots=True)
class Notice:
    """Something the supervisor did, for the live view and the status lines."""

    name: str
    # "exited" (a restart is due after `delay`) | "restarted" | "failed" (respawn raised)
    # | "unresponsive" (it stopped answering its liveness probe: killed, `detail` says how long)
    # | "wedged" (it answers, but says it cannot work: a nats-server's store write error; killed)
    # | "stuck" (wedged, but killing it would not help yet: a full disk; `detail` says what)
    kind: str
    exit_code: int | None
    delay: float
    restarts: int
    detail: str = ""
    at: float = field(default_factory=time.time)

    def describe(self) -> str:
        """One status line, e.g. `restarted coordinator-1 (exit -9) after 0.5 s, 2 restarts`."""
        code = f"exit {self.exit_code}" if self.exit_code is not None else "exit ?"
        if self.kind == "exited":
            return f"{self.name} exited ({code}); restarting in {self.delay:g} s"
        if self.kind == "failed":
            return f"could not restart {self.name} ({code}): {self.detail}; trying again"
        if self.kind == "unresponsive":
            return (
                f"{self.name} stopped answering its liveness probe ({self.detail}): killed to take it "
                "out of the port, a fresh one follows; if this repeats, its log says what it was doing"
            )
        if self.kind == "stuck":
            return f"{self.name} {self.detail}"
        if self.kind == "wedged":
            return (
                f"{self.name} is wedged ({self.detail}): killed, a fresh one follows on the same store; "
                "if this repeats, see its log and the disk under its store"
            )
        plural = "restart" if self.restarts == 1 else "restarts"
        return f"restarted {self.name} ({code}) after {self.delay:g} s, {self.restarts} {plural}"


@dataclass
class Watch:
    """One supervised process: how to see it, await its exit and start it again."""

    name: str
    current: Callable[[], object]  # identity of the running process (changes when replaced)
    wait: Callable[[], Awaitable[int | None]]  # the current process's exit code, once it exits
    respawn: Callable[[], Awaitable[None]]
    # Whether the current process answers (one probe, bounded by the rule's timeout), and how
    # to kill it when it stops (False: it had exited already, which `_run` handles): only
    # processes whose silence harms (a shared port) have one.
    probe: Callable[[], Awaitable[bool]] | None = None
    kill: Callable[[], bool] | None = None
    # How this process is probed, when not by the supervisor's rule; what a failed probe means
    # ("unresponsive", or "wedged" with `wedged()` saying what it reported).
    liveness: LivenessRule | None = None
    wedged: Callable[[], str] | None = None
    supervised: bool = True
    restarts: int = 0
    streak: int = 0
    started_at: float = field(default_factory=time.monotonic)
    holds: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.released.set()


class Supervisor:
    """Restarts watched processes that exit on their own."""

    def __init__(
        self,
        backoff: Backoff = Backoff(),
        on_notice: Callable[[Notice], None] | None = None,
        liveness: LivenessRule = LivenessRule(),
    ) -> None:
        self.backoff = backoff
        self.on_notice = on_notice
        self.liveness = liveness
        self.notices: list[Notice] = []
        self.watches: dict[str, Watch] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._stopping = False

    def watch(self, w: Watch) -> None:
        """Start supervising `w` (replacing an earlier watch of the same name)."""
        for tasks in (self._tasks, self._probes):
            old = tasks.pop(w.name, None)
            if old is not None:
                old.cancel()
        self.watches[w.name] = w
        loop = asyncio.get_running_loop()
        self._tasks[w.name] = loop.create_task(self._run(w), name=f"supervise-{w.name}")
        if w.probe is not None and w.kill is not None:
            self._probes[w.name] = loop.create_task(self._probe(w), name=f"liveness-{w.name}")

    @property
    def stopping(self) -> bool:
        """Whether `stop()` was called (nothing is restarted any more)."""
        return self._stopping

    def restarts(self, name: str) -> int:
        """How many times the supervisor restarted `name`."""
        w = self.watches.get(name)
        return w.restarts if w is not None else 0

    def set_supervised(self, name: str, on: bool) -> None:
        """Turn supervision of one process off (it stays down when it exits) or back on."""
        self.watches[name].supervised = on

    @contextlib.contextmanager
    def hold(self, name: str) -> Iterator[None]:
        """Leave `name` alone while inside (a test kills it and starts it again itself)."""
        w = self.watches[name]
        w.holds += 1
        w.released.clear()
        try:
            yield
        finally:
            w.holds -= 1
            if w.holds == 0:
                w.started_at = time.monotonic()
                w.released.set()

    async def stop(self) -> None:
        """Stop supervising: whatever exits from now on stays down."""
        self._stopping = True
        tasks = [*self._tasks.values(), *self._probes.values()]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    def notify(self, n: Notice) -> None:
        """Record and show what happened (a watch's own probe may say something too)."""
        self.notices.append(n)
        # INFO: `motor up` prints the notice itself (on_notice); a warning would say it twice.
        log.info("%s", n.describe())
        if self.on_notice is not None:
            self.on_notice(n)

    async def _run(self, w: Watch) -> None:
        while not self._stopping:
            proc = w.current()
            if proc is None:
                return  # stopped deliberately (nothing runs under this name)
            code = await w.wait()
            if self._stopping:
                return
            await w.released.wait()
            if w.current() is not proc:
                continue  # replaced while we waited: follow the new process
            if not w.supervised:
                return
            uptime = time.monotonic() - w.started_at
            delay, w.streak = self.backoff.next(w.streak, uptime)
            self.notify(Notice(w.name, "exited", code, delay, w.restarts))
            await asyncio.sleep(delay)  # the backoff itself: nothing to await but time
            if self._stopping:
                return
            if w.current() is not proc or not w.released.is_set():
                continue
            try:
                await w.respawn()
            except Exception as exc:  # a port still held, a binary gone: try again later
                self.notify(Notice(w.name, "failed", code, delay, w.restarts, detail=str(exc)))
                continue
            w.restarts += 1
            w.started_at = time.monotonic()
            self.notify(Notice(w.name, "restarted", code, delay, w.restarts))

    async def _probe(self, w: Watch) -> None:
        """Probe the current process every `interval`; kill it after `misses` in a row.

        Each process is judged from its own first answer (`LivenessRule.step`); one that is
        held or unsupervised is left alone, as its exit would be. After a kill the next
        process is awaited: the exit restarts it through `_run`, with the usual backoff.
        """
        assert w.probe is not None and w.kill is not None
        rule = w.liveness or self.liveness
        proc: object = None
        killed: object = None
        seen = Probing()
        silent_since = 0.0
        while not self._stopping:
            t0 = time.monotonic()
            current = w.current()
            if current is not proc:
                proc, seen = current, Probing()
            if proc is None or proc is killed or w.holds or not w.supervised:
                seen = Probing()  # a held process may be frozen on purpose; judge it afresh after
                await asyncio.sleep(rule.interval)  # nothing to probe: poll for a new process
                continue
            answered = await w.probe()
            if w.current() is not proc or w.holds or self._stopping:
                continue  # replaced or held meanwhile: this answer was about someone else
            before = seen
            seen, verdict = rule.step(seen, answered)
            if verdict is Verdict.MISSED and before.misses == 0:
                silent_since = t0
                if w.wedged is not None:
                    log.warning("%s is wedged: %s", w.name, w.wedged())
                else:
                    log.warning("%s did not answer its liveness probe within %g s", w.name, rule.timeout)
            elif verdict is Verdict.ALIVE and before.misses:
                log.info("%s answers its liveness probe again after %d misses", w.name, before.misses)
            elif verdict is Verdict.KILL:
                silent = time.monotonic() - (silent_since if rule.misses > 1 else t0)
                if not w.kill():  # it died on its own meanwhile: an exit, restarted by `_run`
                    await asyncio.sleep(rule.interval)
                    continue
                if w.wedged is not None:
                    kind, detail = "wedged", f"{w.wedged()}, {seen.misses} probes in a row"
                else:
                    kind, detail = (
                        "unresponsive",
                        f"{seen.misses} probes in a row unanswered, silent {silent:.1f} s",
                    )
                self.notify(Notice(w.name, kind, None, 0.0, w.restarts, detail=detail))
                killed = proc  # its exit is `_run`'s to see: it restarts the next one
                continue
            await asyncio.sleep(max(0.0, rule.interval - (time.monotonic() - t0)))


def die_with_parent() -> None:
    """In a child between fork and exec: SIGTERM it when the process that started it dies.

    `motor up` killed -9 (or its terminal closed under it) then takes its children along: each
    stops as on Ctrl-C (a node agent stops its engines first), instead of running unowned.
    Linux only; elsewhere a no-op.
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


async def wait_popen(proc: subprocess.Popen[bytes]) -> int:
    """Await a child's exit without a thread: a pidfd is readable once the process is gone."""
    if proc.poll() is not None:
        return int(proc.returncode)
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # reaped meanwhile, or no pidfd on this platform
        return await _poll_exit(proc)
    gone = loop.create_future()

    def readable() -> None:
        if not gone.done():
            gone.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await gone
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    # The pidfd says the process exited; reaping it is immediate now.
    return int(proc.wait())


async def _poll_exit(proc: subprocess.Popen[bytes]) -> int:
    delay = 0.05
    while proc.poll() is None:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.5)
    return int(proc.returncode)
