"""A record of what JetStream acknowledged to this process: one JSON line per acked event.

With `MOTOR_ACK_JOURNAL=DIR` in its environment, every publisher of a process appends
`{"id", "type", "stream", "seq", "dup"}` to `DIR/<pid>.jsonl` as each ack arrives. An ack is
JetStream's promise that the event is stored (on a quorum of replicas in a cluster), so after
a server crash, a partition or a lost disk, `motor events acked DIR` can check that every
promise was kept: each acknowledged id is still in the log. Off unless asked for; one
unbuffered `write` per ack (O_APPEND), so processes can share the directory.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import orjson

ENV = "MOTOR_ACK_JOURNAL"


@dataclass(frozen=True, slots=True)
class Acked:
    """One acknowledged publish."""

    id: str
    type: str
    stream: str
    seq: int
    dup: bool = False  # the server had it already (a retried publish inside the dedupe window)


class AckJournal:
    """Appends one line per ack to a file of this process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AckJournal | None:
        """The journal `MOTOR_ACK_JOURNAL` asks for (a directory: `<dir>/<pid>.jsonl`), or None."""
        where = (os.environ if env is None else env).get(ENV, "").strip()
        if not where:
            return None
        return cls(Path(where) / f"{os.getpid()}.jsonl")

    def record(self, event_id: str, event_type: str, stream: str, seq: int, dup: bool) -> None:
        """Note one ack (a failing disk loses the line, never the publish)."""
        line = orjson.dumps({"id": event_id, "type": event_type, "stream": stream, "seq": seq, "dup": dup})
        try:
            os.write(self._fd, line + b"\n")
        except OSError:
            pass


def read_journal(where: Path) -> Iterator[Acked]:
    """Every ack recorded under `where` (a directory of journals, or one file); torn lines skipped."""
    files = sorted(where.glob("*.jsonl")) if where.is_dir() else [where]
    for path in files:
        with path.open("rb") as fh:
            for raw in fh:
                try:
                    d = orjson.loads(raw)
                    yield Acked(str(d["id"]), str(d["type"]), str(d["stream"]), int(d["seq"]), bool(d["dup"]))
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue  # a process killed mid-line


@dataclass(frozen=True, slots=True)
class AckAudit:
    """What became of the acknowledged events of one stream."""

    stream: str
    acked: int  # distinct ids acknowledged
    missing: tuple[Acked, ...]  # acknowledged, no longer in the log
    moved: tuple[tuple[Acked, int], ...]  # in the log at another sequence than acknowledged

    @property
    def kept(self) -> bool:
        """Every acknowledged event is in the log."""
        return not self.missing


def audit(acks: Iterator[Acked] | list[Acked], stream: str, log_ids: Mapping[str, int]) -> AckAudit:
    """Check acks of `stream` against the ids the log holds now (`id -> sequence`)."""
    seen: dict[str, Acked] = {}
    for a in acks:
        if a.stream == stream and a.id not in seen:
            seen[a.id] = a
    missing = tuple(a for a in seen.values() if a.id not in log_ids)
    moved = tuple((a, log_ids[a.id]) for a in seen.values() if a.id in log_ids and log_ids[a.id] != a.seq)
    return AckAudit(stream, len(seen), missing, moved)


def event_id(body: bytes) -> str | None:
    """The `id` of a stored event body (None for a body that is not an event)."""
    try:
        d = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    value = d.get("id") if isinstance(d, dict) else None
    return value if isinstance(value, str) else None
