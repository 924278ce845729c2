"""Re-asserting ground truth: notice when the log no longer knows this node or its instance.

The agent folds the event log (`core.reducer.apply`) like every other component and, every
`interval`, compares it with what it runs. It re-registers (with the engines it actually
runs) when:
- its last registration is no longer in the stream (purged, aged out, or a lost tail);
- the fold has no record of the node (deregistered);
- it runs an instance the fold does not know, or the fold gives the node another instance,
  for two checks in a row (so a terminate-then-stop in flight is not mistaken for a loss),
  unless its latest registration in the log already says what it runs (the controller
  knows the truth then; repeating it would change nothing).
Against MOTOR's age-out it also restates: once its newest registration is `core.ageout.
RESTATE_AT` of the stream's `max_age` old (and nothing above asks for a real one), it says the
registration again (`restated`, with what it runs now) and then each endpoint's status, so a
fold that starts from the log alone, after the first ones aged out, still learns the node
READY. A fold that knows the node changes nothing for either (`core.reducer`).

The fold is a `streams.livefold.LiveFold`: when it finds the log purged, recreated or rewound
it starts over from what the log holds now and the node registers again at once, with what it
runs, so that the log itself holds the truth again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from core import subjects
from core.ageout import restate_due
from core.reducer import apply
from core.state import ClusterState
from streams.definitions import MOTOR_STREAM
from streams.livefold import LiveFold
from streams.log import Log
from streams.lostlog import Loss
from streams.reader import Record

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Running:
    """What the node runs now, as the observer needs it."""

    instance_id: int | None
    endpoints: tuple[int, ...]
    start_seq: int  # stream sequence of the start command (its instance precedes it in the log)


def missing_reason(
    state: ClusterState,
    node_id: str,
    running: Running,
    *,
    reg_seq: int,
    first_seq: int,
    last_seq: int,
) -> tuple[str | None, bool]:
    """Why the node must re-register now (None: it need not), and whether only its instance is off.

    Pure: `reg_seq` is the stream sequence of our last registration, `first_seq`/`last_seq`
    the stream's bounds now, `state` the fold.
    """
    if reg_seq and reg_seq < first_seq:
        return f"registration (seq {reg_seq}) is no longer in the stream (first seq {first_seq})", False
    if reg_seq > last_seq:
        return f"registration (seq {reg_seq}) is beyond the stream's last seq {last_seq}: tail lost", False
    if state.last_seq < reg_seq:
        return None, False  # the fold has not reached our registration yet
    node = state.nodes.get(node_id)
    if node is None:
        return "the log has no registration of this node", False
    if running.instance_id is None or not running.endpoints or state.last_seq < running.start_seq:
        return None, False
    reg = node.reg
    if reg.instance_id == running.instance_id and set(reg.running_endpoints) >= set(running.endpoints):
        return None, False  # our latest registration already tells what runs here
    if running.instance_id not in state.instances:
        return f"instance {running.instance_id} runs here but is missing from the log", True
    if node.instance_id != running.instance_id:
        return f"the log assigns instance {node.instance_id}, this node runs {running.instance_id}", True
    return None, False


class Observer:
    """Follows the log, folds it, and calls `reregister(reason)` when the log lost this node."""

    def __init__(
        self,
        motor: Log,
        node_id: str,
        running: Callable[[], Running],
        reregister: Callable[[str], Awaitable[None]],
        *,
        interval: float,
        restate: Callable[[str], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.motor = motor
        self.monotonic = monotonic
        self.node_id = node_id
        self.running = running
        self.reregister = reregister
        self.restate = restate
        self.interval = interval
        self.state = ClusterState()
        self.reg_seq = 0
        self.log = LiveFold(
            motor,
            self._apply,
            filter_subject=subjects.ALL_EVENTS,
            on_lost=self._on_lost,
            name=f"nodeagent/{node_id} resync",
            clock=clock,
        )
        self.caught_up = self.log.caught_up
        self._registered = -1e9  # monotonic time of our last registration
        self._poke = asyncio.Event()
        self._instance_suspect = False
        self._lost: Loss | None = None  # a lost log not yet answered with a registration

    def registered_at(self, seq: int) -> None:
        """Note the stream sequence of the registration just published."""
        self.reg_seq = seq
        self._registered = self.monotonic()
        self._instance_suspect = False

    async def start(self) -> None:
        await self.log.start()

    def _apply(self, rec: Record) -> None:
        self.state = apply(self.state, rec.event, rec.seq)

    def _on_lost(self, loss: Loss) -> None:
        # The fold starts over from what the log holds now; register again as soon as it caught
        # up (`on_log_lost`). What the log lost may be any of this node's facts, not only its
        # registration: a lost tail can take the READY of engines that serve (the log then says
        # STARTING, and the leader waits out start_timeout + startup_timeout before it asks
        # again), so comparing what survived is not enough. Found by the seeded simulator
        # (tests/sim, seed 32). After a purge sequences go on, so our registration's still tells
        # whether it survived; after a delete-and-recreate (or a rewind) it is a number of a log
        # that is gone.
        view = self.log.last_view
        if loss.kind == "purged" and self.reg_seq and view is not None and self.reg_seq >= view.first_seq:
            # A purge takes a prefix: a registration of ours that survived it came after it, and
            # so did everything the log holds of this node since (it registered again already).
            log.warning("the log was lost (%s): it holds our registration since (seq %d)", loss, self.reg_seq)
        else:
            log.warning("the log was lost (%s): registering again once it is folded", loss)
            self._lost = loss
        self.state = ClusterState()
        if loss.kind != "purged":
            self.reg_seq = 0
        self._poke.set()

    async def run(self) -> None:
        """Check every `interval` seconds (and once the new fold caught up after a lost log)."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._poke.wait()
            if self._poke.is_set():
                self._poke.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10 * self.interval):
                        await self.caught_up.wait()
            try:
                await self.check()
            except Exception as exc:  # NATS slow or away: the next check tries again
                log.warning("resync check skipped: %s", exc)

    async def check(self) -> None:
        """One comparison of the log with what runs here."""
        if not self.caught_up.is_set():
            return
        if self._lost is not None:
            lost, self._lost = self._lost, None
            log.warning("re-registering: the log was lost (%s)", lost)
            await self.reregister(f"the log was lost ({lost})")
            return
        view = await self.motor.stream_info(MOTOR_STREAM)
        first_seq, last_seq = view.first_seq, view.last_seq
        reason, instance_only = missing_reason(
            self.state,
            self.node_id,
            self.running(),
            reg_seq=self.reg_seq,
            first_seq=first_seq,
            last_seq=last_seq,
        )
        if reason is None:
            self._instance_suspect = False
            await self._restate_if_due(view.max_age)
            return
        if not self.reg_seq and self.monotonic() - self._registered < self.interval:
            return  # registered a moment ago, sequence unknown here: it is on its way into the fold
        if instance_only and not self._instance_suspect:
            self._instance_suspect = True  # act only if the next check still sees it
            return
        log.warning("re-registering: %s", reason)
        await self.reregister(reason)

    async def _restate_if_due(self, max_age: float) -> None:
        """Say our registration again before the stream's age-out takes it."""
        if self.restate is None or not self.reg_seq:
            return
        if restate_due(self._registered, self.monotonic(), max_age):
            why = f"registration (seq {self.reg_seq}) is due before MOTOR's max_age of {max_age:g}s"
            log.info("restating: %s", why)
            await self.restate(why)

    async def close(self) -> None:
        await self.log.close()
