"""Telling a lost log from a log that merely aged: pure rules over STREAM.INFO.

A fold that runs for days must notice, while running, that MOTOR no longer holds what it
folded, or it carries on from memory and the log never again holds the truth:

- **recreated**: the stream's `created` time changed (deleted and created again; its
  sequences restart at 1 and are not the ones folded);
- **rewound**: the stream's last sequence is below what was folded (a restored or lost store);
- **purged**: the first sequence moved past messages that were younger than `max_age`. Age-out
  removes a message only once `now - ts > max_age` (server clock), so a removed message whose
  stream timestamp is known to be younger was purged (or deleted by hand), not aged out.

To know removed messages' timestamps the detector keeps a thin list of `(seq, ts)` samples
of what it saw (STREAM.INFO bounds, deliveries), at least `granularity` apart in time: the
newest sample at or below the removed range is a lower bound of the removed message's
timestamp, so a young sample proves a purge.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

# Borderline removals count as age-out: the server's expiry runs on a timer.
SLACK = 1.0
MAX_SAMPLES = 4096

_RFC3339 = re.compile(r"^(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def parse_time(text: str | None) -> float | None:
    """Unix seconds of a JetStream RFC 3339 time (nanoseconds kept to the microsecond); None if unset."""
    if not text or text.startswith("0001-"):
        return None
    m = _RFC3339.match(text)
    if not m:
        return None
    frac = (m.group(2) or ".0")[:7]
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(m.group(1) + frac + zone).timestamp()


def parse_time_ns(text: str | None) -> int:
    """Nanoseconds since the epoch of a JetStream RFC 3339 time, exactly (0 if unset)."""
    if not text or text.startswith("0001-"):
        return 0
    m = _RFC3339.match(text)
    if not m:
        return 0
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    whole = int(datetime.fromisoformat(m.group(1) + zone).timestamp())
    frac = (m.group(2) or ".0")[1:]
    return whole * 1_000_000_000 + int(frac[:9].ljust(9, "0"))


def overwritten(seq: int, folded_ts_ns: int, stored_ts_ns: int | None) -> Loss | None:
    """Why the stream's message at `seq` is not the one folded there, or None.

    A lost tail that new messages wrote over before anyone looked leaves the last sequence
    where it was, so `LossDetector.observe` cannot see it; but the message now at a folded
    sequence was stored at another time. (A message missing altogether is a purge or an
    age-out, which `observe` tells apart.)
    """
    if stored_ts_ns is None or not folded_ts_ns or stored_ts_ns == folded_ts_ns:
        return None
    text = (
        f"stream's message at seq {seq} is not the one folded (stored {stored_ts_ns / 1e9:.6f}, folded one "
        f"{folded_ts_ns / 1e9:.6f}): its tail was lost and written over"
    )
    return Loss("rewound", text)


@dataclass(frozen=True, slots=True)
class StreamView:
    """What one STREAM.INFO said, in the units the rules use."""

    created: str
    first_seq: int
    last_seq: int
    messages: int
    first_ts: float | None
    last_ts: float | None
    now: float  # the server's clock when it answered
    max_age: float  # seconds; 0 keeps messages forever

    @classmethod
    def from_info(cls, info: dict[str, Any]) -> StreamView:
        """Parse a `$JS.API.STREAM.INFO` response."""
        st = info.get("state") or {}
        cfg = info.get("config") or {}
        return cls(
            created=str(info.get("created", "")),
            first_seq=int(st.get("first_seq", 0)),
            last_seq=int(st.get("last_seq", 0)),
            messages=int(st.get("messages", 0)),
            first_ts=parse_time(st.get("first_ts")),
            last_ts=parse_time(st.get("last_ts")),
            now=parse_time(info.get("ts")) or 0.0,
            max_age=int(cfg.get("max_age", 0) or 0) / 1e9,
        )


@dataclass(frozen=True, slots=True)
class Loss:
    """Why the log no longer holds what was folded; `str()` is the sentence for logs."""

    kind: Literal["purged", "recreated", "rewound"]
    text: str

    def __str__(self) -> str:
        return self.text


def removed_while_young(ts: float, now: float, max_age: float) -> bool:
    """Whether a message written at `ts` and gone at `now` cannot have aged out."""
    return max_age <= 0 or ts > now - max_age + SLACK


class LossDetector:
    """Remembers one stream's incarnation and a thin history of its timestamps."""

    def __init__(self, granularity: float = 1.0) -> None:
        self.granularity = granularity
        self.created: str | None = None
        self.samples: collections.deque[tuple[int, float]] = collections.deque()

    def reset(self, view: StreamView | None = None) -> None:
        """Forget the history (a restart of the fold from the stream's start); adopt `view`."""
        self.samples.clear()
        self.created = view.created if view is not None else None
        if view is not None:
            self._learn(view)

    def seen(self, seq: int, ts: float) -> None:
        """Note a message known to exist: sequence `seq` written at stream time `ts`."""
        s = self.samples
        if s and seq <= s[-1][0]:
            return
        if len(s) >= 2 and ts - s[-2][1] < self.granularity:
            s[-1] = (seq, ts)  # keep the newest, spaced at least `granularity` from the one before
        else:
            s.append((seq, ts))
        if len(s) > MAX_SAMPLES:
            self.samples = collections.deque(list(s)[::2] + ([s[-1]] if len(s) % 2 == 0 else []))

    def observe(self, view: StreamView, folded: int) -> Loss | None:
        """Why the log no longer holds what was folded (up to seq `folded`), or None."""
        if self.created is None:
            self.created = view.created
        elif view.created != self.created:
            text = f"stream was deleted and created again (created {view.created}, was {self.created})"
            return Loss("recreated", text)
        if view.last_seq < folded:
            text = f"stream's last seq {view.last_seq} is below the folded seq {folded}: its tail is gone"
            return Loss("rewound", text)
        removed = view.first_seq - 1
        young = self._newest_at_or_below(removed)
        if young is not None and removed_while_young(young[1], view.now, view.max_age):
            text = (
                f"stream was purged: seq {young[0]} (written {view.now - young[1]:.0f}s ago, younger than "
                f"max_age) is gone; first seq is now {view.first_seq}"
            )
            return Loss("purged", text)
        self._learn(view)
        return None

    def _newest_at_or_below(self, seq: int) -> tuple[int, float] | None:
        found = None
        s = self.samples
        while s and s[0][0] <= seq:
            found = s.popleft()  # at or below the new first seq: checked now, never needed again
        return found

    def _learn(self, view: StreamView) -> None:
        # Only messages still in the stream: an empty stream's last seq is already gone.
        if not view.messages:
            return
        if view.first_ts is not None:
            self.seen(view.first_seq, view.first_ts)
        if view.last_ts is not None and view.last_seq >= view.first_seq:
            self.seen(view.last_seq, view.last_ts)


def stale_checkpoint(
    seq: int, view: StreamView, *, stream_created: str | None = None, event_ts: float | None = None
) -> str | None:
    """Why a checkpoint folded to `seq` tells of a past the log no longer has (None: it does not).

    The log wins over a checkpoint: after a lost log, nodes re-register with what they run and
    lost instances are re-adopted, which only happens if the fold starts from the log itself.
    """
    if seq > view.last_seq:
        return f"it is at seq {seq}, past the stream's last seq {view.last_seq}: the log lost its tail"
    if stream_created is not None and stream_created != view.created:
        return f"the stream was created again since ({view.created}, checkpoint of {stream_created})"
    if (
        event_ts is not None
        and seq
        and view.first_seq - 1 >= seq
        and removed_while_young(event_ts, view.now, view.max_age)
    ):
        return f"the stream was purged past it (first seq {view.first_seq}, checkpoint at seq {seq})"
    return None
