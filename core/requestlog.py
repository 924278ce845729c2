"""Why a request went where: one coordinator's record of one request's routing.

A record names the log position the coordinator had folded when the request came (so
`motor replay --request` can show the cluster state it routed on), every attempt with the
candidates it was chosen among and their loads, the endpoints the request's own failures
excluded, how each attempt ended (answered, retried and why, broken and continued, lost to a
hedge), and how the request ended. Records of failed, retried, continued, hedged and slow
requests, and a sample of the rest, are appended to their own stream, MOTOR_REQ
(`motor.req.<request id>`, bounded by age and bytes), never to MOTOR: they are history of
traffic, not lifecycle facts, and no fold reads them.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from core import subjects
from core.bounds import Count, Duration, Seq, Timestamp
from core.eventdata import Frozen
from core.events import EventBase

REQ = f"{subjects.PREFIX}.req"
ALL_REQUESTS = f"{REQ}.>"
REQ_STREAM = "MOTOR_REQ"
MAX_CANDIDATES = 16  # candidates listed per attempt (a fleet's first ones by key)
MAX_ATTEMPTS = 32  # attempts kept per record (a request that outlived more keeps its last ones)


class CandidateLoad(Frozen):
    """One endpoint an attempt could have gone to, and its load then (the policies' input)."""

    endpoint: str
    role: str
    load: Count  # running + waiting (its heartbeat) + this coordinator's in flight on it


class AttemptRecord(Frozen):
    """One attempt: where it went, among what, and how it ended."""

    number: Count
    rid: str  # the engine request id (`{root}#a{n}`)
    endpoint: str  # where the client's answer comes from (a pair's decode)
    prefill: str | None = None  # a pair's prefill
    capability: str | None = None  # the pair's P/D protocol
    hedge: bool = False  # run beside an attempt whose first byte was late
    candidates: tuple[CandidateLoad, ...] = ()
    excluded: tuple[str, ...] = ()  # endpoints this request's own failures excluded
    started_ms: Duration = 0.0  # since the request came
    ended_ms: Duration | None = None
    # answered | retry:<kind> | broken:<kind> | lost (its hedge answered first) | cancelled
    outcome: str = ""
    detail: str = ""


class RequestRecordData(Frozen):
    coordinator: str
    request_id: str  # the coordinator's root id (the engines' ids derive from it)
    client_id: str | None = None  # the client's x-request-id, when it sent one
    route: str
    model: str | None = None
    stream: bool = False
    log_seq: Seq = 0  # the MOTOR position the coordinator had folded when it came
    started: Timestamp
    took_ms: Duration = 0.0
    ttft_ms: Duration | None = None
    status: Count = 0  # the HTTP status the client got (0: it went away first)
    # ok | retried | continued | hedged | failed | slow | cancelled | sampled
    why: tuple[str, ...] = ()
    attempts: tuple[AttemptRecord, ...] = Field(default=(), max_length=MAX_ATTEMPTS)
    ended: str = ""  # how it ended, in words


class RequestRecorded(EventBase):
    """A request's routing record (MOTOR_REQ; not an event of the lifecycle log)."""

    type: Literal["coordinator.request_recorded"] = "coordinator.request_recorded"
    data: RequestRecordData
    SUBJECT: ClassVar[subjects.Placement] = subjects.ByField(f"{REQ}.", "request_id", what="request id")


def subject_of(request_id: str) -> str:
    """Where the record of `request_id` (a root id) is appended."""
    return f"{REQ}.{subjects.check_token(request_id, 'request id')}"
