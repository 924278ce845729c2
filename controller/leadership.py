"""Winning, holding and losing the lease; announcing each reign.

A standby tries to create the lease key every `poll_every(ttl)` (an expired or released key
is free at once); the holder renews it every `renew_every(ttl)` and stops deciding as soon
as its own clock says the lease may be about to lapse. A new holder folds everything the
stream holds, then appends `controller.leader_changed`, whose sequence fences every decision
of its reign. With the default TTL of 2 s a standby decides about 2 s after the leader died.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from controller.appender import Appender
from controller.fold import Fold
from controller.leader import Lease, poll_every, renew_every
from controller.metrics import ControllerMetrics
from controller.rule_context import Decision
from controller.state_queries import outranking_term
from core import subjects
from core.bounds import MAX_TERM
from core.events import LeaderChanged, LeaderChangedData
from core.ids import derive_id
from streams.definitions import LEADER_BUCKET, MOTOR_STREAM
from streams.livefold import LiveFold
from streams.log import Log

log = logging.getLogger(__name__)


def takeover_ask(ttl: float) -> float:
    """How long a new holder waits for the stream's answer before asking again (half the TTL,
    at least 0.5 s): a stream electing a leader never answers a question asked before it has one."""
    return max(0.5, ttl / 2)


class Leadership:
    """This controller's side of the lease: leader or standby."""

    def __init__(
        self,
        log: Log,
        controller_id: str,
        fold: Fold,
        appender: Appender,
        metrics: ControllerMetrics,
        *,
        ttl: float,
        clock: Callable[[], float],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.conn = log  # the connection the lease and the takeover's question travel on
        self.id = controller_id
        self.fold = fold
        self.appender = appender
        self.metrics = metrics
        self.ttl = ttl
        self.clock = clock
        self.lease = Lease(log.kv(LEADER_BUCKET), controller_id, ttl, monotonic=monotonic)
        self.log: LiveFold | None = None  # set by the service once it follows the log
        self.leader = False
        self.monotonic = monotonic
        self.took_over_at = 0.0  # monotonic (controller.heard): the heartbeat grace starts here too
        # The highest term this controller has folded, kept across a lost log (`remember_terms`).
        self.term_floor = 0
        self._terms_spent = False  # MAX_TERM reached: said once

    def may_write(self) -> bool:
        """Leading, and the lease cannot have lapsed on the server yet."""
        return self.leader and self.lease.valid()

    def step_down(self, why: str) -> None:
        """Stop deciding (the lease, if still held, is kept: see `run`)."""
        if self.leader:
            log.warning("no longer leader: %s", why)
        self.leader = False
        self.metrics.is_leader.set(0)

    def deposed(self) -> None:
        """Another controller announced itself: step down and forget the lease."""
        self.step_down("another controller announced itself (a decision was fenced)")
        self.lease.drop()

    async def release(self) -> None:
        """Clean shutdown: give the lease up so a standby takes over at once."""
        self.step_down("shutting down")
        await self.lease.release()

    async def run(self, caught_up: asyncio.Event) -> None:
        """Compete for, hold and renew the lease, for ever."""
        lease, ttl = self.lease, self.ttl
        while True:
            if not self.conn.connected:
                # NATS away: a request now would only queue in the client and land late.
                if self.leader and not lease.valid():
                    self.step_down("NATS is away and the lease may have lapsed")
                await asyncio.sleep(poll_every(ttl))
                continue
            if lease.held and lease.valid(margin=0.0):
                if self.leader or not caught_up.is_set():
                    # Leading, or holding while a lost log is folded again: keep it alive.
                    await asyncio.sleep(renew_every(ttl))
                    await lease.renew()
                    if self.leader and not lease.valid():
                        self.step_down("could not renew the lease in time")
                    continue
                if lease.valid():
                    await self._take_over()
                    if not self.leader:
                        await asyncio.sleep(poll_every(ttl))
                    continue
            if lease.held:
                lease.drop()  # lapsed by our clock: compete again like everyone else
            if self.leader:
                self.step_down("the lease lapsed")
            await caught_up.wait()
            s = self.fold.state
            if not await lease.acquire(term=reign_term(1, s.leader.term if s.leader else None, 0)):
                await asyncio.sleep(poll_every(ttl))

    def remember_terms(self) -> None:
        """Before a lost log is folded again: keep the highest term folded so far.

        Node agents remember the newest term they obeyed and refuse older ones (`stale_term`);
        after a purge the new log names no leader, so a reign counted from the log alone would
        start again at 1 and every command it sends would be refused.
        """
        s = self.fold.state
        self.term_floor = max(self.term_floor, self.lease.term, s.leader.term if s.leader else 0)

    def _still_fenced(self) -> bool:
        """Whether our last announcement is still the last word on the leader subject.

        Then a lease that was late to renew (a loaded machine) but is ours again resumes the
        same reign without a new announcement: the fence still refuses our writes the moment
        anyone else announces, so there is nothing to gain from a new term but log noise.
        """
        fence, s = self.appender.fence, self.fold.state
        return (
            fence is not None
            and s.leader is not None
            and s.leader.leader_id == self.id
            and self.fold.subject_seq.get(subjects.LEADER) == fence
        )

    async def _take_over(self) -> None:
        """Fold everything the stream holds now, then announce the new reign."""
        lease, fold, livefold = self.lease, self.fold, self.log
        assert livefold is not None
        if self._still_fenced():
            assert fold.state.leader is not None
            lease.term = fold.state.leader.term
            self.leader = True
            self.took_over_at = self.monotonic()  # the heartbeat grace starts over too
            self.metrics.is_leader.set(1)
            log.info("leading again (term %d, still fenced by seq %s)", lease.term, self.appender.fence)
            fold.changed.set()
            return
        try:
            # Briefly: after the server leading MOTOR died, the stream answers nothing until a
            # new leader is elected, and only a question asked after that is answered.
            target = (await self.conn.stream_info(MOTOR_STREAM, wait=takeover_ask(self.ttl))).last_seq
        except Exception as exc:  # NATS slow or away, no stream leader yet: try again
            log.warning("won the lease but cannot read the stream's last seq: %s", exc)
            return
        if not await livefold.wait_for(target, within=self.ttl):
            log.warning("won the lease but could not fold to seq %d in time; giving it back", target)
            await lease.release()
            return
        if not await self._announce(target):
            return
        self.leader = True
        self.took_over_at = self.monotonic()
        self.metrics.is_leader.set(1)
        self.metrics.leader_changes.inc()
        log.info("leader now (term %d)", lease.term)
        fold.changed.set()

    async def _announce(self, target: int) -> bool:
        """Append `controller.leader_changed` for a reign past every term known; False when
        the lease lapsed first."""
        lease, fold, livefold = self.lease, self.fold, self.log
        assert livefold is not None
        while lease.valid():
            prev = fold.state.leader
            term = reign_term(lease.term, prev.term if prev else None, self.term_floor)
            lease.term = term
            data = LeaderChangedData(leader_id=self.id, previous=prev.leader_id if prev else None, term=term)
            ev = LeaderChanged(
                id=derive_id("leader", self.id, term, target),
                ts=self.clock(),
                source=f"controller/{self.id}",
                data=data,
            )
            if await self.appender.announce(Decision(ev), lease.valid) is not None:
                return True
            # Someone wrote the leader subject after our fold (or NATS failed): fold, try again.
            await livefold.wait_for(livefold.position + 1, within=0.5)
        return False

    async def outrank(self) -> bool:
        """Announce a newer reign if node agents refused this one's commands as of an older
        term (`stale_term`): they obeyed a reign this controller never folded (it started
        after a purge). True when it announced; the caller decides again once that is folded.

        Called between decisions, by the decide loop, so no append is in flight with the old
        fence.
        """
        seen = outranking_term(self.fold.state)
        if not self.may_write() or seen < self.lease.term:
            return False
        if self.lease.term >= MAX_TERM:
            # No reign can be named past this one; announcing it again would change nothing.
            if not self._terms_spent:
                log.error("node agents obeyed term %d, but this reign has the last term there is", seen)
            self._terms_spent = True
            return False
        log.warning(
            "node agents obeyed term %d, this reign is term %d: announcing a newer one", seen, self.lease.term
        )
        self.term_floor = max(self.term_floor, seen)
        if not await self._announce(self.fold.state.last_seq):
            return False
        self.metrics.leader_changes.inc()
        log.info("leader now (term %d, past the nodes' term %d)", self.lease.term, seen)
        return True


def reign_term(lease_term: int, folded_term: int | None, floor: int) -> int:
    """The term a new reign announces: past the log's last leader and past any term folded
    before a lost log (`floor`), or the lease's own when it is already higher.

    Never past MAX_TERM, the last term an event may carry (`core.bounds` says why that is
    out of reach): the last reign is announced again instead, still fenced by its own
    announcement's sequence, so the controller never writes an event nobody can decode.
    """
    past = max(lease_term, folded_term + 1 if folded_term is not None else 0, floor + 1 if floor else 0)
    return min(past, MAX_TERM)
