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
A fold that is ahead of the stream (the tail was lost) is rebuilt from the start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from nats.aio.client import Client

from core import subjects
from core.reducer import apply
from core.state import ClusterState
from streams.consumer import js_api
from streams.definitions import MOTOR_STREAM
from streams.errors import StreamsError
from streams.reader import Follower

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
        nc: Client,
        node_id: str,
        running: Callable[[], Running],
        reregister: Callable[[str], Awaitable[None]],
        *,
        interval: float,
    ) -> None:
        self.nc = nc
        self.node_id = node_id
        self.running = running
        self.reregister = reregister
        self.interval = interval
        self.state = ClusterState()
        self.reg_seq = 0
        self.caught_up = asyncio.Event()
        self._instance_suspect = False
        self._fold_task: asyncio.Task[None] | None = None

    def registered_at(self, seq: int) -> None:
        """Note the stream sequence of the registration just published."""
        self.reg_seq = seq
        self._instance_suspect = False

    async def start(self) -> None:
        self._restart_fold()

    def _restart_fold(self) -> None:
        if self._fold_task is not None:
            self._fold_task.cancel()
        self.state = ClusterState()
        self.caught_up = asyncio.Event()
        self._fold_task = asyncio.create_task(self._fold(), name="observer-fold")

    async def _fold(self) -> None:
        # The fold is advisory: if following fails, start over rather than stop the agent.
        while True:
            follower = Follower(self.nc, MOTOR_STREAM, filter_subject=subjects.ALL_EVENTS)
            # The follower flags "caught up" once the last pending record was taken, which
            # is while this loop waits for the next one: mirror it from a side task.
            mirror = asyncio.create_task(self._mirror(follower))
            try:
                async for rec in follower:
                    self.state = apply(self.state, rec.event, rec.seq)
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("following the log failed; rebuilding the fold in 1s")
                self.state = ClusterState()
                self.caught_up.clear()
                await asyncio.sleep(1.0)
            finally:
                mirror.cancel()
                with contextlib.suppress(Exception):
                    await follower.close()

    async def _mirror(self, follower: Follower) -> None:
        await follower.caught_up.wait()
        self.caught_up.set()

    async def run(self) -> None:
        """Check every `interval` seconds until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except (StreamsError, OSError) as exc:
                log.warning("resync check skipped: %s", exc)

    async def check(self) -> None:
        """One comparison of the log with what runs here."""
        if not self.caught_up.is_set():
            return
        info = await js_api(self.nc, f"$JS.API.STREAM.INFO.{MOTOR_STREAM}")
        first_seq = int(info["state"]["first_seq"])
        last_seq = int(info["state"]["last_seq"])
        if self.state.last_seq > last_seq:
            log.warning(
                "fold at seq %d is past the stream's last seq %d: rebuilding it",
                self.state.last_seq,
                last_seq,
            )
            self._restart_fold()
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
            return
        if instance_only and not self._instance_suspect:
            self._instance_suspect = True  # act only if the next check still sees it
            return
        log.warning("re-registering: %s", reason)
        await self.reregister(reason)

    async def close(self) -> None:
        if self._fold_task is not None:
            self._fold_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._fold_task
