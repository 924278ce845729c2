"""The log used offline: fold a range of it into a ClusterState, export it to JSONL, import it.

`motor replay`, `motor events export/import` and the tests use it. A fold is the same
`core.reducer.apply` the controller runs, so a replay to sequence N shows exactly what the
controller knew at N. JSONL lines are `{"stream", "seq", "subject", "time", "event"}` with
the event exactly as stored, so an incident log attached to a bug report replays elsewhere.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import PubAck
from nats.js.errors import APIError

from core.codec import decode
from core.errors import DecodeError
from core.ids import derive_id
from core.reducer import apply
from core.state import ClusterState
from streams.definitions import MOTOR_STREAM
from streams.errors import StreamsError
from streams.log import EVERYTHING, Range
from streams.poison import INAPPLICABLE, Skipped, reason_for
from streams.publisher import MOTOR_TYPE, MSG_ID
from streams.reader import read_batches, read_deliveries

MAX_LISTED = 1000  # skipped events kept by a replay for display (all are counted)


@dataclass
class ReplayStats:
    """What a fold read: counts, sequence range, skips by reason, and how fast."""

    applied: int = 0
    skipped: int = 0
    skip_reasons: collections.Counter[str] = field(default_factory=collections.Counter)
    skipped_events: list[Skipped] = field(default_factory=list)  # the first MAX_LISTED, for display
    first_seq: int = 0
    last_seq: int = 0
    elapsed: float = 0.0

    def skip(self, stream: str, seq: int, subject: str, reason: str, detail: str) -> None:
        """Count one event the fold went on without."""
        self.skip_reasons[reason] += 1
        if len(self.skipped_events) < MAX_LISTED:
            self.skipped_events.append(Skipped(stream, seq, subject, reason, detail))

    @property
    def events_per_second(self) -> float:
        return (self.applied + self.skipped) / self.elapsed if self.elapsed > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "applied": self.applied,
            "skipped": self.skipped,
            "skip_reasons": dict(self.skip_reasons),
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "elapsed": round(self.elapsed, 6),
            "events_per_second": round(self.events_per_second, 1),
        }


async def fold_stream(
    nc: Client,
    *,
    until_seq: int | None = None,
    until_time: float | None = None,
    state: ClusterState | None = None,
    stream: str = MOTOR_STREAM,
    raw: bool | None = None,
) -> tuple[ClusterState, ReplayStats]:
    """Fold the stream into a state: from the start, or after `state.last_seq` (a checkpoint)."""
    s = state if state is not None else ClusterState()
    stats = ReplayStats()
    start = s.last_seq + 1 if state is not None and s.last_seq else None
    t0 = time.perf_counter()
    applied = 0
    span = Range(start_seq=start, until_seq=until_seq, until_time=until_time)
    async for batch in read_batches(nc, stream, span, raw=raw):
        if not stats.first_seq:
            stats.first_seq = batch[0].seq
        for d in batch:
            try:
                ev = decode(d.data, d.subject)
            except DecodeError as exc:
                stats.skip(stream, d.seq, d.subject, reason_for(exc), str(exc))
                continue
            try:
                s = apply(s, ev, d.seq)
            except Exception as exc:  # a reducer bug costs one event, not the replay
                stats.skip(stream, d.seq, d.subject, INAPPLICABLE, f"{type(exc).__name__}: {exc}")
                continue
            applied += 1
        stats.last_seq = batch[-1].seq
    stats.applied = applied
    stats.skipped = sum(stats.skip_reasons.values())
    stats.elapsed = time.perf_counter() - t0
    return s, stats


# --------------------------------------------------------------------------- JSONL


def export_line(stream: str, seq: int, subject: str, time_s: float, body: bytes) -> bytes:
    """One JSONL line; the event body is embedded verbatim (even one this code cannot read)."""
    try:
        event: Any = orjson.Fragment(body) if body[:1] == b"{" else body.decode("utf-8", "replace")
        line = orjson.dumps(
            {"stream": stream, "seq": seq, "subject": subject, "time": time_s, "event": event}
        )
        orjson.loads(line)  # a corrupt body must not corrupt the file
    except (orjson.JSONDecodeError, orjson.JSONEncodeError):
        text = body.decode("utf-8", "replace")
        line = orjson.dumps({"stream": stream, "seq": seq, "subject": subject, "time": time_s, "event": text})
    return line + b"\n"


async def export_jsonl(
    nc: Client,
    path: Path | str,
    *,
    streams: Sequence[str] = (MOTOR_STREAM,),
    span: Range = EVERYTHING,
) -> int:
    """Write the streams' messages (as they exist now) to a JSONL file; return how many."""
    count = 0
    # Buffered local writes are far cheaper than the network reads between them.
    with Path(path).open("wb") as fh:  # noqa: ASYNC230
        for stream in streams:
            async for d in read_deliveries(nc, stream, span):
                fh.write(export_line(stream, d.seq, d.subject, d.ts_ns / 1e9, d.data))
                count += 1
    return count


@dataclass(frozen=True, slots=True)
class JsonlRecord:
    """One parsed line of an export."""

    line_no: int
    stream: str
    seq: int
    subject: str
    time: float | None
    event: Any  # the raw JSON event (dict), or a string if it was not JSON when exported


def iter_jsonl(path: Path | str) -> Iterator[JsonlRecord]:
    """Parse an export, naming the file and line of anything malformed."""
    with Path(path).open("rb") as fh:
        for no, raw in enumerate(fh, 1):
            if not raw.strip():
                continue
            try:
                obj = orjson.loads(raw)
                rec = JsonlRecord(
                    no,
                    str(obj["stream"]),
                    int(obj["seq"]),
                    str(obj["subject"]),
                    float(obj["time"]) if obj.get("time") is not None else None,
                    obj["event"],
                )
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                raise StreamsError(f"{path}:{no}: not an export line ({exc})") from None
            yield rec


async def import_jsonl(
    js: JetStreamContext, path: Path | str, *, window: int = 256, ack_timeout: float = 5.0
) -> int:
    """Republish an export's events on their subjects (Nats-Msg-Id dedupe); return how many.

    Bodies that were not JSON when exported go back as they were (folds skip them again).
    The dedupe window is two minutes: importing the same file again later appends copies.
    """
    count = 0
    pending: collections.deque[tuple[int, asyncio.Future[PubAck]]] = collections.deque()
    for rec in iter_jsonl(path):
        event = rec.event
        if isinstance(event, dict):
            body = orjson.dumps(event)
            event_id, event_type = event.get("id"), event.get("type")
        else:
            body = str(event).encode()
            event_id, event_type = None, None
        hdr = {MSG_ID: event_id if isinstance(event_id, str) else derive_id("import", rec.stream, rec.seq)}
        if isinstance(event_type, str):
            hdr[MOTOR_TYPE] = event_type
        fut = await js.publish_async(rec.subject, body, headers=hdr)
        pending.append((rec.line_no, fut))
        count += 1
        while len(pending) >= window:
            await _settle(path, *pending.popleft(), ack_timeout)
    while pending:
        await _settle(path, *pending.popleft(), ack_timeout)
    return count


async def _settle(path: Path | str, line_no: int, fut: asyncio.Future[PubAck], ack_timeout: float) -> None:
    try:
        await asyncio.wait_for(fut, ack_timeout)
    except TimeoutError:
        raise StreamsError(f"{path}:{line_no}: no ack within {ack_timeout}s") from None
    except APIError as exc:
        raise StreamsError(f"{path}:{line_no}: {exc.description or exc}") from None
