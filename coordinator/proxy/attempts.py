"""The attempt loop: every attempt of a request on the candidate its filter leaves, until one
answers. Every ending the client sees without an engine's answer is made here.

One loop serves every use of trying again: a failure before the first byte (`Retry`) excludes
the endpoint and tries the next candidate; a stream (or folded whole answer) whose engine
broke (`Broken`) excludes it and goes on with the continuation `resume.py` says, on any
candidate of the model, with a fresh retry budget. The `Filter` is what changes between
attempts. A hedge is one more use (`hedge.py`): a second attempt run beside a first one whose
first byte is late, on a candidate that shares none of its endpoints, the first to answer
carrying the request on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from coordinator.adapters import adapter_for
from coordinator.choose import Chooser
from coordinator.endpoint import Candidate, Incarnation, Plan
from coordinator.faultlog import FaultLog
from coordinator.metrics import CoordinatorMetrics
from coordinator.plan import why_not
from coordinator.policies import RequestInfo
from coordinator.proxy.continuation import Progress
from coordinator.proxy.deliver import Delivery
from coordinator.proxy.hedge import Hedger
from coordinator.proxy.legs import Attempt, Legs
from coordinator.proxy.outcome import Broken, Retry
from coordinator.proxy.record import Recorder
from coordinator.proxy.resume import on_broken
from coordinator.table import RoutingTable

log = logging.getLogger(__name__)


class Filter:
    """The endpoints a request's next attempt may not use: those that failed it, each tied to
    the engine process that failed it (a new process behind the endpoint is a candidate again)."""

    __slots__ = ("excluded", "failed_as", "made")

    def __init__(self) -> None:
        self.excluded: set[str] = set()
        self.failed_as: dict[str, Incarnation | None] = {}
        self.made = 0  # attempts made so far, hedges included: the next one's number is one more

    def exclude(self, key: str) -> None:
        """`key` failed this request: no candidate for it from now on."""
        self.excluded.add(key)

    def readmit(self, current: Callable[[str], Incarnation | None]) -> list[str]:
        """Excluded endpoints that `current` now says are another process than the one that
        failed: candidates again (the failure was the old process's, as its circuit was).
        Returns them. An exclusion is tied to the process `current` names the first time it
        is seen here: the loop asks before every choice, with no wait between a failure and
        the next choice, so that is the process that failed."""
        if not self.excluded:
            return []
        seen = self.failed_as
        back = []
        for key in list(self.excluded):
            now = current(key)
            if key not in seen:
                seen[key] = now
            elif seen[key] != now:
                back.append(key)
                del seen[key]
                self.excluded.discard(key)
        return back


class Attempts:
    """Runs a request's attempts over its plan; the candidates come from the chooser."""

    def __init__(
        self,
        table: RoutingTable,
        chooser: Chooser,
        legs: Legs,
        *,
        retries: int,
        metrics: CoordinatorMetrics | None = None,
        faults: FaultLog | None = None,
        hedger: Hedger | None = None,
    ) -> None:
        self.table = table
        self.chooser = chooser
        self.legs = legs
        self.retries = retries
        self.metrics = metrics
        self.faults = faults
        self.hedger = hedger
        if hedger is not None:
            hedger.start, hedger.run = self._hedge, self._run_hedge

    async def run(self, d: Delivery, plan: Plan) -> None:
        """Serve the request on its plan's candidates until one answers or none is left."""
        ask = d.ask
        filt = Filter()
        body, raw = ask.body, ask.raw
        progress: Progress | None = None
        resuming: str | None = None  # the endpoint a stream broke on, until it goes on elsewhere
        while True:
            info = RequestInfo(ask.model, None, ask.root, body)
            last: Retry | None = None
            broken: Broken | None = None
            for _ in range(self.retries + 1):
                self.readmit(d, filt)
                cand = self.chooser.choose(plan, info, filt.excluded)
                if cand is None:
                    break
                filt.made += 1
                at = Attempt(self.legs, d, body, raw, filt.made, prefill=cand.prefill, resuming=resuming)
                if d.trace is not None:
                    Recorder.attempt(d.trace, at, cand, self.table.routable(), filt.excluded)
                h = self.hedger
                try:
                    if h is None:
                        with cand.ep.busy:
                            await self.attempt(at, cand)
                        return
                    at.ctx = (plan, info, filt, cand)
                    h.watch(at, cand.ep)
                    try:
                        with cand.ep.busy:
                            await self.attempt(at, cand)
                    except Retry as r:
                        if at.race is None or at.race.task is None or at.race.winner is at:
                            raise
                        await self.carry_on(at, r, filt)  # it failed, or lost: the hedge goes on
                    except BaseException:
                        race = at.race
                        if race is not None and race.task is not None:
                            race.task.cancel()  # the client went away, or `at` answered and broke
                        raise
                    finally:
                        h.ended(at)
                        if at.race is not None and at.race.task is not None:
                            self.legs.keep(at.race.task)  # a hedge that failed unawaited is only logged
                    return
                except Retry as r:
                    if r.ep is not None:
                        filt.exclude(r.ep.key)
                    last, resuming = r, carrier(at).resuming
                    self.retried(r)
                    if d.trace is not None:
                        Recorder.outcome(d.trace, r.ep.key if r.ep else None, f"retry:{r.kind}", r.reason)
                except Broken as b:
                    broken = b
                    filt.exclude(b.ep.key)
                    if d.trace is not None:
                        Recorder.outcome(d.trace, b.ep.key, f"broken:{b.exc.kind}", str(b.exc))
                    nxt = on_broken(carrier(at), b, progress)
                    if nxt is None:
                        return
                    body, raw, progress, resuming = nxt.body, nxt.raw, nxt.progress, b.ep.key
                    d.sink, d.fold = nxt.sink, nxt.fold
                # The next attempt weighs the candidates there are now: the plan was made when
                # the request came, and one that came back since (a restarted union) was not in it.
                plan = self.table.plan(ask.model, ask.route.serves)
                if broken is not None:
                    break  # a continuation goes on with a fresh retry budget
            if broken is None:
                self.fail(d, filt, last, resuming, attempts=filt.made)
                return

    async def carry_on(self, at: Attempt, failed: Retry, filt: Filter) -> None:
        """`at` failed or lost to its hedge (`hedge.py`): the hedge carries the request, and
        this returns or raises as it does."""
        if failed.ep is not None:
            filt.exclude(failed.ep.key)
        lost = failed.cause is not None and failed.cause.lost
        if not lost:
            self.retried(failed)
        if at.d.trace is not None:
            what = "lost" if lost else f"retry:{failed.kind}"
            Recorder.outcome(at.d.trace, failed.ep.key if failed.ep else None, what, failed.reason)
        race = at.race
        assert race is not None and race.task is not None
        await race.task

    def _hedge(self, at: Attempt) -> tuple[Attempt, Candidate] | None:
        """The hedge of `at`: an attempt on a candidate that shares none of its endpoints."""
        plan, info, filt, cand = at.ctx
        skip = set(filt.excluded)
        skip.add(cand.ep.key)
        if cand.prefill is not None:
            skip.add(cand.prefill.key)
        other = self.chooser.choose(self.table.plan(at.ask.model, at.ask.route.serves), info, skip)
        if other is None:
            return None
        filt.made += 1
        hedge = Attempt(
            self.legs, at.d, at.body, at.raw, filt.made, prefill=other.prefill, resuming=at.resuming
        )
        hedge.ctx = (plan, info, filt, other)
        if at.d.trace is not None:
            Recorder.attempt(at.d.trace, hedge, other, self.table.routable(), skip, hedge=True)
        return hedge, other

    async def _run_hedge(self, hedge: Attempt, cand: Candidate) -> None:
        """A hedge, beside the attempt it races (in a task of its own)."""
        assert self.hedger is not None
        try:
            with cand.ep.busy:
                await self.attempt(hedge, cand)
        except Retry as r:
            if r.ep is not None:
                hedge.ctx[2].exclude(r.ep.key)  # the request's filter: no later attempt goes there
            if hedge.d.trace is not None:
                what = "lost" if r.cause is not None and r.cause.lost else f"retry:{r.kind}"
                Recorder.outcome(hedge.d.trace, r.ep.key if r.ep else None, what, r.reason)
            raise
        except asyncio.CancelledError:
            if hedge.d.trace is not None:
                race = hedge.race
                won = race is not None and race.winner is not None and race.winner is not hedge
                what, why = ("lost", "the attempt it raced answered first") if won else ("cancelled", "")
                Recorder.outcome(hedge.d.trace, cand.ep.key, what, why)
            raise
        finally:
            self.hedger.ended(hedge)

    def attempt(self, at: Attempt, cand: Candidate) -> Coroutine[Any, Any, None]:
        """One attempt on one candidate: a single hop, or the pair's adapter (the coroutine is
        handed back, not awaited: a frame fewer on the hot path). A hedge would run this twice."""
        if cand.prefill is None:
            return self.legs.serve(at, cand.ep, at.raw)
        return self._pair(at, cand)

    async def _pair(self, at: Attempt, cand: Candidate) -> None:
        """Run a P/D candidate through its protocol's adapter (refused when none speaks it)."""
        assert cand.prefill is not None
        adapter = adapter_for(cand.capability)
        if adapter is None:
            self.fail(at.d, None, None, at.resuming, f"P/D protocol {cand.capability!r} has no adapter")
            return
        await adapter.run(at, cand.prefill, cand.ep)

    # ------------------------------------------------------------------ endings

    def fail(
        self,
        d: Delivery,
        filt: Filter | None,
        last: Retry | None,
        resuming: str | None,
        what: str | None = None,
        *,
        attempts: int = 0,
    ) -> None:
        """Answer a request no attempt could serve (in the client's dialect)."""
        if resuming is not None and self.faults is not None:
            self.faults.failed(resuming)  # a stream, or a folded whole answer, not continued
        ask = d.ask
        if d.committed:
            msg = last.reason if last is not None else (what or self._no_path(d, filt))
            log.warning("stream %s ends with an error: %s", ask.root, msg)
            d.end_with_error(msg)
            return
        if last is None:
            d.send_error(503, what or self._no_path(d, filt))
            return
        # A request that reached engines and still failed: say why no candidate was left.
        log.warning(
            "request %s failed after %d attempt(s), last: %s; %s",
            ask.tag,
            attempts,
            last.reason,
            self._no_path(d, filt),
        )
        if last.body is not None:
            d.relay_error(last.status, last.body)
        else:
            d.send_error(last.status, f"every attempt failed; last: {last.reason}")

    def _no_path(self, d: Delivery, filt: Filter | None) -> str:
        """Why no candidate is left: each known endpoint of the model and its state."""
        ask = d.ask
        model = f" for model {ask.model!r}" if ask.model else ""
        why = why_not(self.table.describe(), ask.model, ask.route.serves, filt.excluded if filt else ())
        return f"no healthy path left{model}" + (f" ({'; '.join(why)})" if why else "")

    def readmit(self, d: Delivery, filt: Filter) -> None:
        """An endpoint that failed this request earlier is READY again as a new process: the
        request may go there (a request that outlived an engine's restart, its other
        candidates failing meanwhile, got 502 while the restarted engine idled)."""
        for key in filt.readmit(self.table.incarnation):
            log.info(
                "request %s: %s is a new process since it failed this request: a candidate again",
                d.ask.tag,
                key,
            )
            if self.metrics is not None:
                self.metrics.readmitted.inc()

    def retried(self, r: Retry) -> None:
        """Count and log an attempt that failed before the first byte (another one follows)."""
        log.info("retrying elsewhere: %s", r.reason)
        if self.metrics is not None:
            self.metrics.retries.labels(reason="timeout" if r.status == 504 else "upstream").inc()
        if self.faults is not None and r.ep is not None:
            self.faults.retried(r.ep.key, r.kind)


def carrier(at: Attempt) -> Attempt:
    """The attempt that carried the request: `at`, or its hedge when the hedge answered first."""
    race = at.race
    if race is not None and race.winner is not None:
        return race.winner  # type: ignore[return-value]  # a race is between two `Attempt`s
    return at
