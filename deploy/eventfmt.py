"""Formatting for `motor events`: positions (seq, time, age), stream tables, event rows."""

from __future__ import annotations

import collections
import re
import sys
import time
from datetime import UTC, datetime
from typing import Any

import orjson

from streams.log import Range

_AGE = re.compile(r"^(\d+(?:\.\d+)?)(s|m|h|d)$")
_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class BadArgument(ValueError):
    """A flag value the user has to fix; the message names the flag."""


Position = tuple[str, float]  # ("seq", n) or ("time", unix seconds)


def parse_position(text: str, flag: str, *, now: float | None = None) -> Position:
    """A stream sequence (`120`), an age (`10m`, `2h`), Unix seconds (`1764410000.5`) or ISO 8601."""
    text = text.strip()
    if text.isascii() and text.isdigit():  # not '¹', which int() refuses
        return ("seq", int(text))
    m = _AGE.match(text)
    if m:
        return ("time", (now if now is not None else time.time()) - float(m.group(1)) * _UNIT[m.group(2)])
    try:
        value = float(text)
    except ValueError:
        pass
    else:
        if value > 0:
            return ("time", value)
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise BadArgument(
            f"{flag} {text!r} is not a sequence (120), an age (10m, 2h), Unix seconds or ISO 8601 "
            "(2026-11-29T10:42:01, UTC unless a zone is given)"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return ("time", dt.timestamp())


def range_of(since: Position | None, until: Position | None, subject: str | None = None) -> Range:
    """The part of a stream between a since/until pair, on an optional subject filter."""
    return Range(
        start_seq=int(since[1]) if since is not None and since[0] == "seq" else None,
        start_time=since[1] if since is not None and since[0] == "time" else None,
        until_seq=int(until[1]) if until is not None and until[0] == "seq" else None,
        until_time=until[1] if until is not None and until[0] == "time" else None,
        filter_subject=subject,
    )


def fmt_time(ts: float | None) -> str:
    """UTC time with milliseconds, or '-'."""
    if ts is None or ts <= 0:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def short_time(ts: float | None) -> str:
    """`MM-DD HH:MM:SS.mmm` in UTC (tables are narrow), or '-'."""
    if ts is None or ts <= 0:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%m-%d %H:%M:%S.%f")[:-3]


def _go_time(text: str | None) -> float | None:
    # JetStream reports RFC 3339 with nanoseconds; Python parses up to microseconds.
    if not text or text.startswith("0001-"):
        return None
    m = re.match(r"^(.*T\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", text)
    if not m:
        return None
    frac = (m.group(2) or ".0")[:7]
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    return datetime.fromisoformat(m.group(1) + frac + zone).timestamp()


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


async def stream_rows(nc: Any) -> list[dict[str, Any]]:
    """One row per stream on the server (Motor's and any other)."""
    from streams.consumer import js_api

    rows: list[dict[str, Any]] = []
    offset = 0
    while True:
        page = await js_api(nc, "$JS.API.STREAM.LIST", {"offset": offset})
        for info in page.get("streams") or []:
            cfg, st = info["config"], info["state"]
            rows.append(
                {
                    "stream": cfg["name"],
                    "subjects": cfg.get("subjects") or [],
                    "messages": st.get("messages", 0),
                    "bytes": st.get("bytes", 0),
                    "first_seq": st.get("first_seq", 0),
                    "last_seq": st.get("last_seq", 0),
                    "first_time": _go_time(st.get("first_ts")),
                    "last_time": _go_time(st.get("last_ts")),
                    "consumers": st.get("consumer_count", 0),
                }
            )
        offset += len(page.get("streams") or [])
        if not page.get("streams") or offset >= page.get("total", 0):
            break
    rows.sort(key=lambda r: (not r["stream"].startswith("MOTOR"), r["stream"]))
    return rows


def print_streams(rows: list[dict[str, Any]], *, as_json: bool) -> None:
    """The `events ls` output."""
    if as_json:
        sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title="JetStream streams (subjects: --json)",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("stream", no_wrap=True)
    table.add_column("msgs", justify="right", no_wrap=True)
    table.add_column("bytes", justify="right", no_wrap=True)
    table.add_column("first", justify="right", no_wrap=True)
    table.add_column("last", justify="right", no_wrap=True)
    table.add_column("newest (UTC)", no_wrap=True)
    for r in rows:
        table.add_row(
            Text(r["stream"]),
            f"{r['messages']:,}",
            human_bytes(r["bytes"]),
            str(r["first_seq"]),
            str(r["last_seq"]),
            short_time(r["last_time"])[:14],
        )
    if not rows:
        print("no streams on this server yet (`motor up` creates them)")
        return
    Console().print(table)


def summarize(data: Any) -> str:
    """`k=v` pairs of an event's data, empty values left out."""
    if not isinstance(data, dict):
        return orjson.dumps(data).decode()
    parts = []
    for k, v in data.items():
        if v is None or v == "" or v == [] or v == {}:
            continue
        text = v if isinstance(v, str) else orjson.dumps(v).decode()
        parts.append(f"{k}={text}")
    return " ".join(parts)


class EventTable:
    """Rows of events: printed as a table at the end, or as JSON lines (at once when live)."""

    def __init__(self, stream: str, *, as_json: bool, live: bool = False) -> None:
        self.stream = stream
        self.as_json = as_json
        self.live = live
        self.rows: collections.deque[dict[str, Any]] = collections.deque()
        self._console: Any = None

    def add(
        self, seq: int, subject: str, ts: float | None, body: bytes, keep_last: int | None = None
    ) -> None:
        """One message; `keep_last` bounds how many rows are kept (the tail wins)."""
        try:
            event: Any = orjson.loads(body)
        except orjson.JSONDecodeError:
            event = body.decode("utf-8", "replace")
        row = {"stream": self.stream, "seq": seq, "subject": subject, "time": ts, "event": event}
        poison = skip_reason(body, subject)
        if poison is not None:
            row["skipped"] = {"reason": poison[0], "detail": poison[1]}
        if self.live:
            row["time"] = ts if ts is not None else time.time()
            self._emit(row)
            return
        self.rows.append(row)
        if keep_last is not None and len(self.rows) > keep_last:
            self.rows.popleft()

    def _emit(self, row: dict[str, Any]) -> None:
        if self.as_json:
            sys.stdout.write(orjson.dumps(row).decode() + "\n")
            sys.stdout.flush()
            return
        if self._console is None:
            from rich.console import Console

            self._console = Console(highlight=False)
        etype, summary = _cells(row)
        from rich.text import Text

        line = Text.assemble(
            (fmt_time(row["time"]), "dim"),
            " ",
            (row["subject"], "cyan"),
            " ",
            (str(etype), "bold"),
            " ",
            summary,
        )
        self._console.print(line, soft_wrap=True)

    def print(self) -> None:
        """Print what was collected."""
        if self.as_json:
            out = sys.stdout
            for row in self.rows:
                out.write(orjson.dumps(row).decode() + "\n")
            return
        if not self.rows:
            print("no events in that range")
            return
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"{self.stream}: {len(self.rows)} events", title_justify="left")
        table.add_column("seq", justify="right", no_wrap=True)
        table.add_column("time (UTC)", no_wrap=True)
        table.add_column("subject", style="cyan")
        table.add_column("type", style="bold")
        table.add_column("data", overflow="fold")
        for row in self.rows:
            etype, summary = _cells(row)
            # Text, not str: event data must never be read as rich markup.
            table.add_row(
                str(row["seq"]), short_time(row["time"]), Text(row["subject"]), Text(etype), Text(summary)
            )
        Console(highlight=False).print(table)


def skip_reason(body: bytes, subject: str | None = None) -> tuple[str, str] | None:
    """(reason, detail) when a fold would skip this message (undecodable, unknown type, newer
    schema, on a subject its data does not name)."""
    from core.codec import decode
    from core.errors import DecodeError
    from streams.poison import reason_for

    try:
        decode(body, subject)
    except DecodeError as exc:
        return reason_for(exc), str(exc)
    return None


def _cells(row: dict[str, Any]) -> tuple[str, str]:
    """The type and data cells of a row; a message folds skip says so, with the reason."""
    ev = row["event"]
    if isinstance(ev, dict):
        etype, summary = str(ev.get("type", "?")), summarize(ev.get("data"))
    else:
        etype, summary = "(not JSON)", str(ev)
    skipped = row.get("skipped")
    if skipped:
        return f"{etype} SKIPPED: {skipped['reason']}", f"{skipped['detail']} | {summary}"
    return etype, summary
