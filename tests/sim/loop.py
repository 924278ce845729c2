"""The simulator's event loop: virtual time, and processes that can be frozen or killed.

**Virtual time.** asyncio's loop asks its selector to wait until the next timer when nothing
is ready. Here the selector waits for nothing: it moves the loop's clock to that timer and
returns, so a minute of timeouts, leases and heartbeats passes in the milliseconds the code
takes to run, and every run of the same code from the same seed takes the same steps (ready
callbacks in FIFO order, timers by time then by when they were set: nothing depends on the
machine). With nothing ready and no timer left every task waits for something that can never
happen, which is a bug of the simulated system, not a pause: `Deadlock`.

**Processes.** Each simulated process (a controller, a node agent, the coordinator) runs its
tasks in a context naming its `Proc`; every callback the loop runs (a task's next step, a
future's wake-up, a timer) is looked at first. A frozen process's callbacks wait until it is
thawed, when they run late, as a SIGSTOPped process's would; a killed process's never run
again: no `finally`, no clean shutdown, as after SIGKILL. What a process had in flight on the
network is the network's (tests/sim/network.py), and arrives anyway.
"""

from __future__ import annotations

import asyncio
import contextvars
import heapq
import selectors
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

EPOCH = 1_800_000_000.0  # wall clock at virtual time 0 (2027-01-15): fixed, so runs repeat


class Deadlock(RuntimeError):
    """Nothing is ready and no timer is set: every task waits for something that cannot come."""


@dataclass(eq=False)
class Proc:
    """One simulated process."""

    name: str
    frozen: bool = False
    dead: bool = False
    deferred: list[asyncio.Handle] = field(default_factory=list)  # due while frozen: run on thaw


PROC: contextvars.ContextVar[Proc | None] = contextvars.ContextVar("sim_proc", default=None)


def _gate(handle: asyncio.Handle) -> bool:
    """Whether `handle` runs now: not if its process is dead; later if it is frozen."""
    proc = handle._context.get(PROC)  # type: ignore[attr-defined]
    if proc is None:
        return True
    if proc.frozen and not proc.dead:
        proc.deferred.append(handle)
    return not (proc.dead or proc.frozen)


class _Gated(asyncio.Handle):
    """A ready callback of the simulated processes."""

    __slots__ = ()

    def _run(self) -> None:
        if _gate(self):
            super()._run()  # type: ignore[misc]


class _GatedTimer(asyncio.TimerHandle):
    """A timer of the simulated processes."""

    __slots__ = ()

    def __lt__(self, other: asyncio.TimerHandle) -> bool:
        # The heap's one question, asked many times a timer: every timer here is one of these.
        return self._when < other._when  # type: ignore[attr-defined, no-any-return]

    def _run(self) -> None:
        if _gate(self):
            super()._run()  # type: ignore[misc]


class _Selector(selectors.BaseSelector):
    """Waits for nothing: a wait is the clock moving on."""

    def __init__(self, loop: SimLoop) -> None:
        self._loop = loop
        self._keys: dict[int, selectors.SelectorKey] = {}

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._keys[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._keys.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Deadlock("no task is ready and no timer is set")
        if timeout > 0:
            self._loop.advance(timeout)
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._keys

    def close(self) -> None:
        self._keys.clear()


class SimLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time whose callbacks belong to simulated processes."""

    def __init__(self) -> None:
        self._now = 0.0
        super().__init__(_Selector(self))
        self.set_exception_handler(_quiet_about_the_dead)

    def time(self) -> float:
        return self._now

    def wall(self) -> float:
        """The simulated wall clock (what `time.time()` is in production)."""
        return EPOCH + self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds

    def _run_once(self) -> None:
        """asyncio's one step (`BaseEventLoop._run_once`, the same steps in the same order) without
        what a loop that never waits for a socket pays for nothing: the select, its events, the
        clock read thrice. The loop's whole cost is in here, a hundred thousand steps a seed."""
        if self._debug:  # type: ignore[attr-defined]
            super()._run_once()  # type: ignore[misc]  # its slow-callback reports
            return
        sched: list[asyncio.TimerHandle] = self._scheduled  # type: ignore[attr-defined]
        ready = self._ready  # type: ignore[attr-defined]
        n = len(sched)
        if n > 100 and self._timer_cancelled_count / n > 0.5:  # type: ignore[attr-defined]
            keep = []
            for handle in sched:
                if handle._cancelled:  # type: ignore[attr-defined]
                    handle._scheduled = False  # type: ignore[attr-defined]
                else:
                    keep.append(handle)
            heapq.heapify(keep)
            self._scheduled = sched = keep
            self._timer_cancelled_count = 0
        else:
            while sched and sched[0]._cancelled:  # type: ignore[attr-defined]
                self._timer_cancelled_count -= 1
                heapq.heappop(sched)._scheduled = False  # type: ignore[attr-defined]
        if not ready and not self._stopping:  # type: ignore[attr-defined]
            if not sched:
                raise Deadlock("no task is ready and no timer is set")
            # What the selector's wait would have done (`_Selector.select`), to the same float.
            self._now += min(max(0.0, sched[0]._when - self._now), 24 * 3600.0)  # type: ignore[attr-defined]
        end = self._now + self._clock_resolution  # type: ignore[attr-defined]
        while sched and sched[0]._when < end:  # type: ignore[attr-defined]
            handle = heapq.heappop(sched)
            handle._scheduled = False  # type: ignore[attr-defined]
            ready.append(handle)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:  # type: ignore[attr-defined]
                handle._run()  # type: ignore[attr-defined]

    # Every callback passes the gate: the handle itself (`_Gated`, `_GatedTimer`), so a
    # callback deferred by a freeze is the same handle when it runs late, and still honours a
    # `cancel()` made meanwhile (asyncio.timeout relies on it). No wrapper around the callback:
    # one that had to find its own handle again made a reference cycle of every callback, and
    # the collector's work on them was a third of a seed's time.

    def call_soon(
        self, callback: Callable[..., object], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.Handle:  # type: ignore[override]
        self._check_closed()  # type: ignore[attr-defined]
        handle = _Gated(callback, args, self, context)
        self._ready.append(handle)  # type: ignore[attr-defined]
        return handle

    def call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:  # type: ignore[override]
        self._check_closed()  # type: ignore[attr-defined]
        timer = _GatedTimer(when, callback, args, self, context)
        heapq.heappush(self._scheduled, timer)  # type: ignore[attr-defined]
        timer._scheduled = True  # type: ignore[attr-defined]
        return timer

    # ------------------------------------------------------------------ processes

    def spawn(self, proc: Proc, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        """Run `coro` as the first task of `proc`; every task it makes belongs to `proc` too."""
        ctx = contextvars.copy_context()
        ctx.run(PROC.set, proc)
        task = self.create_task(coro, name=name or proc.name, context=ctx)
        return task

    def freeze(self, proc: Proc) -> None:
        proc.frozen = True

    def thaw(self, proc: Proc) -> None:
        """Run what the process missed, in the order it would have run."""
        proc.frozen = False
        deferred, proc.deferred = proc.deferred, []
        self._ready.extend(deferred)  # type: ignore[attr-defined]  # a cancelled one is skipped there

    def kill(self, proc: Proc) -> None:
        """SIGKILL: nothing of it runs again."""
        proc.dead = True
        proc.frozen = False
        proc.deferred.clear()


def _quiet_about_the_dead(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    # A killed process's tasks stay pending for ever; their garbage collection is no error.
    if str(context.get("message", "")).startswith("Task was destroyed but it is pending"):
        return
    loop.default_exception_handler(context)
