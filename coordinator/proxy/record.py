"""Every request's routing decision, kept (`core.requestlog`): the pipeline begins a `Trace`
when a request is planned, the attempt loop notes each attempt on it (where, among which
candidates and their loads, what the request's failures excluded, how it ended), and the
pipeline ends it with the client's status.

Every trace stays in a bounded ring in memory (`GET /v1/requests/{id}` on the management
API, by the coordinator's id or the client's `x-request-id`); the record of a request that
failed, was retried, continued, hedged or slow, or was sampled (`coordinator.decisions`), is
appended to MOTOR_REQ through the same bounded background queue as the fault decisions, so
NATS away costs a queue slot, never a request. On the hot path a trace is a few slotted
objects: the pydantic record is built only when it is appended or asked for.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from typing import Any

from coordinator.endpoint import Candidate, Endpoint
from core.ids import new_id
from core.requestlog import (
    MAX_ATTEMPTS,
    MAX_CANDIDATES,
    AttemptRecord,
    CandidateLoad,
    RequestRecordData,
    RequestRecorded,
)


class Step:
    """One attempt as the trace has it (made mutable; `AttemptRecord` is its frozen form)."""

    __slots__ = (
        "cand",
        "detail",
        "ended",
        "excluded",
        "hedge",
        "loads",
        "number",
        "outcome",
        "rid",
        "started",
    )

    def __init__(
        self, number: int, rid: str, cand: Candidate, loads: list[tuple[Endpoint, int]],
        excluded: tuple[str, ...], started: float, hedge: bool,
    ) -> None:  # fmt: skip
        self.number = number
        self.rid = rid
        self.cand = cand
        self.loads = loads  # the model's routable endpoints then, with their loads then
        self.excluded = excluded
        self.started = started
        self.hedge = hedge
        self.ended: float | None = None
        self.outcome = ""
        self.detail = ""

    def record(self, t0: float) -> AttemptRecord:
        c = self.cand
        return AttemptRecord(
            number=self.number,
            rid=self.rid,
            endpoint=c.ep.key,
            prefill=c.prefill.key if c.prefill is not None else None,
            capability=c.capability,
            hedge=self.hedge,
            candidates=tuple(CandidateLoad(endpoint=e.key, role=e.role.value, load=n) for e, n in self.loads),
            excluded=self.excluded,
            started_ms=round((self.started - t0) * 1000, 3),
            ended_ms=round((self.ended - t0) * 1000, 3) if self.ended is not None else None,
            outcome=self.outcome,
            detail=self.detail[:500],
        )


class Trace:
    """One request's routing, as it happens."""

    __slots__ = ("client_id", "ended", "flags", "log_seq", "model", "root", "route", "status", "steps", "stream",
                 "t0", "took", "ttft")  # fmt: skip

    def __init__(
        self, root: str, client_id: str | None, route: str, model: str | None, stream: bool, log_seq: int, t0: float
    ) -> None:  # fmt: skip
        self.root = root
        self.client_id = client_id
        self.route = route
        self.model = model
        self.stream = stream
        self.log_seq = log_seq
        self.t0 = t0  # perf_counter, as the request's own
        self.steps: list[Step] = []
        self.status = 0
        self.took = 0.0
        self.ttft: float | None = None
        self.ended = ""
        self.flags = 0  # RETRIED | CONTINUED | HEDGED, as attempts are noted

    def why(self, slow: float) -> list[str]:
        """What makes this request worth a record in MOTOR_REQ (empty: an ordinary one)."""
        out: list[str] = []
        if self.status == 0 or self.status >= 500 or self.ended.startswith("cut"):
            out.append("failed" if self.status != 0 or self.ended else "cancelled")
        flags = self.flags
        if flags:
            out += [name for bit, name in _FLAGS if flags & bit]
        if self.took >= slow:
            out.append("slow")
        return out

    def record(self, coordinator: str, why: list[str]) -> RequestRecorded:
        steps = self.steps[-MAX_ATTEMPTS:]
        now = time.time()
        return RequestRecorded(
            id=new_id(),
            ts=now,
            source=f"coordinator/{coordinator}",
            data=RequestRecordData(
                coordinator=coordinator,
                request_id=self.root,
                client_id=self.client_id,
                route=self.route,
                model=self.model,
                stream=self.stream,
                log_seq=self.log_seq,
                started=max(0.0, now - (time.perf_counter() - self.t0)),
                took_ms=round(self.took * 1000, 3),
                ttft_ms=round(self.ttft * 1000, 3) if self.ttft is not None else None,
                status=self.status,
                why=tuple(why) or ("ok",),
                attempts=tuple(s.record(self.t0) for s in steps),
                ended=self.ended,
            ),
        )


RETRIED, CONTINUED, HEDGED = 1, 2, 4
_FLAGS = ((RETRIED, "retried"), (CONTINUED, "continued"), (HEDGED, "hedged"))


class Recorder:
    """The ring of traces, and what goes to MOTOR_REQ."""

    def __init__(
        self,
        coordinator: str,
        *,
        ring: int = 4096,
        sample: float = 0.0,
        slow: float = 10.0,
        post: Callable[[Any], bool] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.size = ring
        self.sample = sample
        self.slow = slow
        self.post = post  # the fault outbox's `post` (None: no NATS publisher)
        self.rng = rng or random.Random()
        self.ring: OrderedDict[str, Trace] = OrderedDict()
        self.by_client: dict[str, str] = {}

    def begin(
        self, root: str, client_id: str | None, route: str, model: str | None, stream: bool, log_seq: int, t0: float
    ) -> Trace:  # fmt: skip
        """A trace for a request just planned (kept in the ring from now on)."""
        t = Trace(root, client_id, route, model, stream, log_seq, t0)
        ring = self.ring
        ring[root] = t
        if client_id is not None:
            self.by_client[client_id] = root
        if len(ring) > self.size:
            _, old = ring.popitem(last=False)
            if old.client_id is not None and self.by_client.get(old.client_id) == old.root:
                del self.by_client[old.client_id]
        return t

    @staticmethod
    def attempt(
        t: Trace, at: Any, cand: Candidate, routable: Sequence[Endpoint], excluded: Collection[str],
        *, hedge: bool = False,
    ) -> None:  # fmt: skip
        """Note attempt `at` on `cand`, chosen among the model's endpoints of `routable` (with
        their loads now)."""
        model = t.model
        loads = [(e, e.running + e.waiting + e.inflight) for e in routable if e.serves(model)]
        if len(loads) > MAX_CANDIDATES:
            del loads[MAX_CANDIDATES:]
        if hedge:
            t.flags |= HEDGED
        t.steps.append(
            Step(at.number, at.rid, cand, loads, tuple(sorted(excluded)) if excluded else (), at.t0, hedge)
        )

    @staticmethod
    def outcome(t: Trace, key: str | None, outcome: str, detail: str = "") -> None:
        """How the latest open attempt on endpoint `key` ended (the first word said stays)."""
        for s in reversed(t.steps):
            c = s.cand
            if not s.outcome and (
                key is None or c.ep.key == key or (c.prefill is not None and c.prefill.key == key)
            ):
                s.outcome, s.detail, s.ended = outcome, detail, time.perf_counter()
                if outcome.startswith("retry"):
                    t.flags |= RETRIED
                elif outcome.startswith("broken"):
                    t.flags |= CONTINUED
                return

    def end(self, t: Trace, status: int, ttft: float | None, ended: str) -> None:
        """The request is over: its record goes to MOTOR_REQ if it is worth one."""
        t.status, t.ttft, t.ended = status, ttft, ended
        now = time.perf_counter()
        t.took = now - t.t0
        for s in t.steps:
            if not s.outcome:
                s.outcome, s.ended = ("answered" if status and status < 500 else "cancelled"), now
        if self.post is None:
            return
        if t.flags or not 0 < status < 500 or t.took >= self.slow or ended[:3] == "cut":
            why = t.why(self.slow)
        elif self.sample > 0 and self.rng.random() < self.sample:
            why = ["sampled"]
        else:
            return  # an ordinary request: the ring has it
        if why:
            self.post(t.record(self.coordinator, why))

    def find(self, request_id: str) -> RequestRecorded | None:
        """The record of a request in the ring, by the coordinator's id or the client's."""
        t = self.ring.get(request_id) or self.ring.get(self.by_client.get(request_id, ""))
        if t is None:
            return None
        return t.record(self.coordinator, t.why(self.slow))
