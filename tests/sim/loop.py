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
    deferred: list[
        tuple[list[asyncio.Handle], Callable[..., object], tuple[Any, ...], contextvars.Context]
    ] = field(default_factory=list)


PROC: contextvars.ContextVar[Proc | None] = contextvars.ContextVar("sim_proc", default=None)


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

    # Every callback passes the gate. It carries its original handle: a callback deferred by a
    # freeze still honours a later `cancel()` of that handle (asyncio.timeout relies on it).

    def call_soon(
        self, callback: Callable[..., object], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.Handle:  # type: ignore[override]
        ctx = context if context is not None else contextvars.copy_context()
        cell: list[asyncio.Handle] = []
        handle = super().call_soon(self._gate, cell, callback, args, ctx, context=ctx)
        cell.append(handle)
        return handle

    def call_at(
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:  # type: ignore[override]
        ctx = context if context is not None else contextvars.copy_context()
        cell: list[asyncio.Handle] = []
        handle = super().call_at(when, self._gate, cell, callback, args, ctx, context=ctx)
        cell.append(handle)
        return handle

    def _gate(
        self,
        cell: list[asyncio.Handle],
        callback: Callable[..., object],
        args: tuple[Any, ...],
        ctx: contextvars.Context,
    ) -> None:
        if cell[0].cancelled():
            return
        proc = PROC.get()
        if proc is not None:
            if proc.dead:
                return
            if proc.frozen:
                proc.deferred.append((cell, callback, args, ctx))
                return
        callback(*args)

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
        for cell, cb, args, ctx in deferred:
            super().call_soon(self._gate, cell, cb, args, ctx, context=ctx)

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
