"""`motor events ls|view|sub|export|import|ensure|acked`: look at the log without the nats CLI.

Subjects and bodies are plain JSON, so what `view --json` prints is what natscli would
show; tables are for people, `--json` (one object a line, the export format) for scripts.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from typing import Any

from deploy.common import add_nats_args, nats_options, unreachable_hint

PROG = "motor events"
DEFAULT_LAST = 50


def register(sub: Any) -> None:
    p = sub.add_parser("events", help="list, view, follow, export and import the event log")
    esub = p.add_subparsers(dest="events_cmd", metavar="ACTION", required=True)

    ls = esub.add_parser("ls", help="streams with message counts, bytes and sequence ranges")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _common(ls, _ls)

    view = esub.add_parser("view", help="show events from the log (the last 50 unless told otherwise)")
    view.add_argument("--stream", default="MOTOR", help="stream to read (default %(default)s)")
    view.add_argument("--subject", metavar="FILTER", help="subject filter, e.g. 'motor.evt.*.n7'")
    view.add_argument(
        "--since",
        metavar="SEQ|TIME",
        help="from a stream sequence, a time (ISO 8601, Unix seconds) or an age (10m)",
    )
    view.add_argument("--until", metavar="SEQ|TIME", help="up to a stream sequence or a time")
    view.add_argument(
        "--last", type=int, metavar="N", help=f"only the last N events (default {DEFAULT_LAST})"
    )
    view.add_argument(
        "--json", action="store_true", help="one JSON object a line: {stream, seq, subject, time, event}"
    )
    _common(view, _view)

    s = esub.add_parser("sub", help="print messages on a subject as they are published")
    s.add_argument("subject", help="subject or wildcard, e.g. 'motor.>' or 'motor.hb.*'")
    s.add_argument("--count", type=int, metavar="N", help="exit after N messages")
    s.add_argument("--json", action="store_true", help="one JSON object a line")
    _common(s, _sub)

    ex = esub.add_parser("export", help="write the log to a JSONL file (attach it to a bug report)")
    ex.add_argument("file", metavar="FILE.jsonl")
    ex.add_argument(
        "--stream",
        action="append",
        dest="streams",
        metavar="NAME",
        help="stream to export (repeatable; default MOTOR)",
    )
    ex.add_argument("--since", metavar="SEQ|TIME", help="from a stream sequence, a time or an age")
    ex.add_argument("--until", metavar="SEQ|TIME", help="up to a stream sequence or a time")
    _common(ex, _export)

    im = esub.add_parser("import", help="republish a JSONL export (duplicates within 2 minutes are dropped)")
    im.add_argument("file", metavar="FILE.jsonl")
    _common(im, _import)
    im.set_defaults(nats_login="admin")  # it writes any subject: motor up's `admin` user

    ak = esub.add_parser(
        "acked",
        help="check that every event JetStream acknowledged (MOTOR_ACK_JOURNAL=DIR) is still in the log",
    )
    ak.add_argument("journal", metavar="DIR", help="the directory MOTOR_ACK_JOURNAL named (or one .jsonl)")
    ak.add_argument("--stream", default="MOTOR", help="stream to check (default %(default)s)")
    ak.add_argument("--json", action="store_true", help="print the result as JSON")
    _common(ak, _acked)

    en = esub.add_parser(
        "ensure",
        help="create the streams and KV buckets, or update their settings, as the config says (admin)",
        description="What the controller would create at start, made by a user allowed to (admin): "
        "an external NATS, where only admin may create or change streams (Kubernetes runs it "
        "before each controller starts).",
    )
    en.add_argument("--config", help="cluster config file (YAML/JSON); default: the embedded default")
    _common(en, _ensure)
    en.set_defaults(nats_login="admin")


def _common(parser: argparse.ArgumentParser, func: Any) -> None:
    add_nats_args(parser)
    parser.set_defaults(func=lambda args: _run(args, func))


def _run(args: argparse.Namespace, func: Any) -> int:
    """Run one action; turn the errors a user can fix into one line on stderr."""
    from core.errors import ConfigError
    from deploy.eventfmt import BadArgument
    from streams.errors import NatsUnavailable, StreamsError

    try:
        return int(asyncio.run(func(args)) or 0)
    except NatsUnavailable as exc:
        print(f"{PROG}: {unreachable_hint(args.nats_url, exc)} ({_cause(exc)})", file=sys.stderr)
        return 1
    except (BadArgument, ConfigError) as exc:
        print(f"{PROG} {args.events_cmd}: {exc}", file=sys.stderr)
        return 2
    except (StreamsError, OSError) as exc:
        print(f"{PROG} {args.events_cmd}: {exc}", file=sys.stderr)
        return 1


def _cause(exc: Exception) -> str:
    text = str(exc)
    return text.split(": ", 1)[1] if ": " in text else text


async def _connect(args: argparse.Namespace) -> Any:
    from streams.connection import connect

    return await connect(nats_options(args), name=f"motor-events-{args.events_cmd}")


async def _ls(args: argparse.Namespace) -> int:
    from deploy.eventfmt import print_streams, stream_rows

    nc = await _connect(args)
    try:
        rows = await stream_rows(nc)
    finally:
        await nc.close()
    print_streams(rows, as_json=args.json)
    return 0


async def _view(args: argparse.Namespace) -> int:
    from deploy.eventfmt import EventTable, parse_position, range_of
    from streams.consumer import StreamMissing
    from streams.reader import read_deliveries

    since = parse_position(args.since, "--since") if args.since else None
    until = parse_position(args.until, "--until") if args.until else None
    if args.last is not None and args.last < 1:
        from deploy.eventfmt import BadArgument

        raise BadArgument("--last must be at least 1")
    last = args.last if args.last is not None else (None if since else DEFAULT_LAST)
    span = range_of(since, until, args.subject)
    nc = await _connect(args)
    table = EventTable(args.stream, as_json=args.json)
    try:
        if last is not None and since is None and not args.subject:
            # Without a filter the tail is a sequence range: no need to read the whole stream.
            from streams.reader import stream_last_seq

            end = span.until_seq or await stream_last_seq(nc, args.stream)
            span = dataclasses.replace(span, start_seq=max(1, end - last + 1))
        async for d in read_deliveries(nc, args.stream, span):
            table.add(d.seq, d.subject, d.ts_ns / 1e9, d.data, keep_last=last)
    except StreamMissing:
        print(
            f"{PROG} view: no stream {args.stream} on this server yet (`motor up` creates it)",
            file=sys.stderr,
        )
        return 1
    finally:
        await nc.close()
    table.print()
    return 0


async def _sub(args: argparse.Namespace) -> int:
    from deploy.eventfmt import EventTable

    nc = await _connect(args)
    table = EventTable("", as_json=args.json, live=True)
    done = asyncio.Event()
    seen = 0

    async def on_msg(msg: Any) -> None:
        nonlocal seen
        table.add(0, msg.subject, None, msg.data)
        seen += 1
        if args.count is not None and seen >= args.count:
            done.set()

    try:
        await nc.subscribe(args.subject, cb=on_msg)
        await nc.flush()
        print(f"listening on {args.subject} (Ctrl-C to stop)", file=sys.stderr, flush=True)
        await done.wait()
    finally:
        await nc.close()
    return 0


async def _export(args: argparse.Namespace) -> int:
    from deploy.eventfmt import parse_position, range_of
    from streams.offline import export_jsonl

    since = parse_position(args.since, "--since") if args.since else None
    until = parse_position(args.until, "--until") if args.until else None
    streams = tuple(args.streams or ["MOTOR"])
    nc = await _connect(args)
    try:
        n = await export_jsonl(nc, args.file, streams=streams, span=range_of(since, until))
    finally:
        await nc.close()
    print(f"exported {n} messages from {', '.join(streams)} to {args.file}", file=sys.stderr)
    return 0


async def _import(args: argparse.Namespace) -> int:
    from streams.definitions import ensure_streams
    from streams.offline import import_jsonl

    nc = await _connect(args)
    try:
        js = nc.jetstream()
        await ensure_streams(js, update=False)
        n = await import_jsonl(js, args.file)
    finally:
        await nc.close()
    print(f"imported {n} messages from {args.file}", file=sys.stderr)
    return 0


async def _acked(args: argparse.Namespace) -> int:
    from pathlib import Path

    import orjson

    from streams.ackjournal import audit, event_id, read_journal
    from streams.reader import read_deliveries

    where = Path(args.journal)
    try:
        acks = await asyncio.to_thread(lambda: list(read_journal(where)))
    except FileNotFoundError:
        print(
            f"{PROG} acked: no journal at {where} (set MOTOR_ACK_JOURNAL=DIR for the processes)",
            file=sys.stderr,
        )
        return 2
    nc = await _connect(args)
    ids: dict[str, int] = {}
    try:
        async for d in read_deliveries(nc, args.stream):
            eid = event_id(d.data)
            if eid is not None:
                ids.setdefault(eid, d.seq)
    finally:
        await nc.close()
    result = audit(acks, args.stream, ids)
    if args.json:
        print(
            orjson.dumps(
                {
                    "stream": result.stream,
                    "acked": result.acked,
                    "missing": [{"id": a.id, "type": a.type, "seq": a.seq} for a in result.missing],
                    "moved": [{"id": a.id, "acked_seq": a.seq, "log_seq": seq} for a, seq in result.moved],
                }
            ).decode()
        )
    elif result.kept:
        moved = f" ({len(result.moved)} at another sequence than acknowledged)" if result.moved else ""
        print(f"{result.acked} acknowledged events of {result.stream}: every one is in the log{moved}")
    else:
        print(
            f"{len(result.missing)} of {result.acked} acknowledged events of {result.stream} are "
            "not in the log:"
        )
        for a in result.missing[:50]:
            print(f"  seq {a.seq}  {a.type}  {a.id}")
    return 0 if result.kept else 1


async def _ensure(args: argparse.Namespace) -> int:
    from deploy.common import load_config_file
    from deploy.eventfmt import print_streams, stream_rows
    from streams.definitions import ensure_streams

    cfg = load_config_file(args.config)  # before connecting: a bad file is named, NATS untouched
    nc = await _connect(args)
    try:
        # The same settings the controller ensures at start, so it finds nothing to change
        # (its NATS user may not change streams).
        await ensure_streams(nc.jetstream(), cfg.nats, lease_ttl=cfg.controller.lease_ttl)
        rows = await stream_rows(nc)
    finally:
        await nc.close()
    print_streams(rows, as_json=False)
    return 0
