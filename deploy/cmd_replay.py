"""`motor replay`: rebuild the controller's and the coordinator's state at any point.

From the live stream or a JSONL export; `--explain` walks the chain behind an entity,
`--timeline` writes an offline HTML page, `--verify` re-runs the controller's decide.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from deploy.common import add_nats_args, load_config_file, nats_options, unreachable_hint

MAX_LISTED = 1000  # skipped events listed by a replay (all are counted)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "replay",
        help="rebuild cluster state at a point of the log; explain, timeline, verify",
        description="Rebuild the controller's and coordinator's state from the log (live or a JSONL export).",
    )
    src = p.add_argument_group("what to replay")
    src.add_argument("--from-file", metavar="FILE.jsonl", help="replay an export instead of the live stream")
    src.add_argument("--until-seq", type=int, default=None, help="stop after this stream sequence")
    src.add_argument("--until-time", default=None, help="stop at this time (ISO 8601, or Unix seconds)")
    out = p.add_argument_group("what to show")
    out.add_argument(
        "--explain", nargs=2, metavar=("KIND", "ID"), help="e.g. `--explain instance 3`, `--explain node n7`"
    )
    out.add_argument(
        "--request",
        metavar="ID",
        help="why a request went where: its routing record (MOTOR_REQ; the coordinator's request id "
        "or the client's x-request-id) beside the cluster state it was routed on",
    )
    out.add_argument("--timeline", metavar="FILE.html", help="write an offline HTML timeline of the range")
    out.add_argument(
        "--verify", action="store_true", help="re-run decide and report decisions the code would not make"
    )
    out.add_argument("--config", help="cluster config used by --verify (default: the embedded default)")
    out.add_argument("--json", action="store_true", help="print the rebuilt state as JSON")
    add_nats_args(p)
    p.set_defaults(func=_replay)


def parse_time(text: str) -> float:
    """Unix seconds, or an ISO 8601 time (UTC when no zone is given)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise SystemExit(
            f"motor replay: --until-time {text!r} is neither Unix seconds nor ISO 8601 (e.g. 2026-11-29T10:42:01)"
        ) from None
    if dt.tzinfo is None:
        from datetime import UTC

        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


async def load_records(args: argparse.Namespace) -> tuple[list[Any], list[Any]]:
    """The records of the range asked for, and the events that could not be decoded (`Skipped`)."""
    until_time = parse_time(args.until_time) if args.until_time else None
    if args.from_file:
        return read_jsonl_records(Path(args.from_file), until_seq=args.until_seq, until_time=until_time)
    from streams.connection import connect
    from streams.definitions import MOTOR_STREAM
    from streams.log import Range
    from streams.reader import SkipCounter, read_range

    skips = SkipCounter(MOTOR_STREAM, keep=MAX_LISTED, quiet=True)
    span = Range(until_seq=args.until_seq, until_time=until_time)
    nc = await asyncio.wait_for(connect(nats_options(args), name="motor-replay"), timeout=5)
    try:
        records = [r async for r in read_range(nc, MOTOR_STREAM, span, skips=skips)]
    finally:
        await nc.close()
    return records, list(skips.recent)


def read_jsonl_records(
    path: Path, *, until_seq: int | None = None, until_time: float | None = None
) -> tuple[list[Any], list[Any]]:
    """The MOTOR records of an export as typed events, and the lines that could not be decoded."""
    from core.codec import decode_dict
    from core.errors import DecodeError
    from streams.definitions import MOTOR_STREAM
    from streams.offline import iter_jsonl
    from streams.poison import Skipped, reason_for
    from streams.reader import Record

    if not path.exists():
        raise FileNotFoundError(f"{path}: no such export file")
    records: list[Any] = []
    skipped: list[Any] = []
    for line in iter_jsonl(path):
        if line.stream != MOTOR_STREAM:
            continue
        if until_seq is not None and line.seq > until_seq:
            break
        try:
            if not isinstance(line.event, dict):
                raise DecodeError("not a JSON object")
            ev = decode_dict(line.event)
        except DecodeError as exc:
            skipped.append(Skipped(MOTOR_STREAM, line.seq, line.subject, reason_for(exc), str(exc)))
            continue
        if until_time is not None and ev.ts > until_time:
            break
        records.append(Record(MOTOR_STREAM, line.seq, line.subject, ev))
    return records, skipped


def fold_records(records: list[Any], skipped: list[Any]) -> tuple[Any, list[Any]]:
    """Fold records into a state; one the reducer cannot apply is skipped (`inapplicable`) and dropped."""
    from core.reducer import apply
    from core.state import ClusterState
    from streams.poison import INAPPLICABLE, Skipped

    state = ClusterState()
    kept: list[Any] = []
    for rec in records:
        try:
            state = apply(state, rec.event, rec.seq)
        except Exception as exc:  # the tool for debugging a poisoned log must not die on it
            skipped.append(
                Skipped(rec.stream, rec.seq, rec.subject, INAPPLICABLE, f"{type(exc).__name__}: {exc}")
            )
            continue
        kept.append(rec)
    records[:] = kept
    skipped.sort(key=lambda s: s.seq)
    return state, skipped


def _replay(args: argparse.Namespace) -> int:
    from streams.errors import NatsUnavailable, StreamsError

    found: Any = None
    try:
        if args.request:
            if args.from_file:
                print("motor replay: --request reads MOTOR_REQ from NATS, not an export", file=sys.stderr)
                return 2
            found = asyncio.run(find_request(args, args.request))
            if found is None:
                print(
                    f"motor replay: no record of request {args.request!r} in MOTOR_REQ (coordinators record "
                    "failed, retried, continued, hedged and slow requests, and `coordinator.decisions.sample` "
                    "of the rest; a recent one is also at GET /v1/requests/ID on its coordinator)",
                    file=sys.stderr,
                )
                return 1
            args.until_time = args.until_time or str(found.started + found.took_ms / 1000 + 5)
        records, skipped = asyncio.run(load_records(args))
        if args.timeline and not args.from_file and records:
            # The coordinators' request records of the same span, as marks of their own.
            args.request_marks = asyncio.run(
                load_request_records(args, records[0].event.ts, records[-1].event.ts)
            )
    except NatsUnavailable as exc:
        print(f"motor replay: {unreachable_hint(args.nats_url, exc)} ({exc})", file=sys.stderr)
        return 1
    except StreamsError as exc:
        print(f"motor replay: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:
        print(f"motor replay: {exc}", file=sys.stderr)
        return 1
    except (OSError, TimeoutError) as exc:
        print(f"motor replay: {unreachable_hint(args.nats_url, exc)} ({exc})", file=sys.stderr)
        return 1
    if args.request:
        from deploy.replay_request import render_request

        print(render_request(found, records))
        return 0
    return run_replay(args, records, skipped)


MAX_MARKS = 10_000  # request records a timeline marks (the newest of the span are kept)


async def load_request_records(args: argparse.Namespace, since: float, until: float) -> list[Any]:
    """MOTOR_REQ's records from `since` to `until`, as records a timeline draws (seq 0: they
    are no position of MOTOR)."""
    from datetime import UTC

    from nats.js.api import ConsumerConfig, DeliverPolicy

    from core.requestlog import ALL_REQUESTS, REQ_STREAM, RequestRecorded
    from streams.connection import connect

    nc = await asyncio.wait_for(connect(nats_options(args), name="motor-replay"), timeout=5)
    out: list[Any] = []
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(REQ_STREAM)
        except Exception:  # an older cluster without MOTOR_REQ: nothing to mark
            return []
        if not info.state.messages:
            return []
        start = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=datetime.fromtimestamp(since, tz=UTC)
        )
        sub = await js.subscribe(ALL_REQUESTS, ordered_consumer=True, config=start)
        try:
            while True:
                try:
                    m = await sub.next_msg(timeout=2)
                except TimeoutError:
                    break
                ev = RequestRecorded.model_validate_json(m.data)
                if ev.ts > until:
                    break
                out.append(SimpleNamespace(stream=REQ_STREAM, seq=0, subject=m.subject, event=ev))
                if m.metadata.sequence.stream >= info.state.last_seq:
                    break
        finally:
            await sub.unsubscribe()
    finally:
        await nc.close()
    return out[-MAX_MARKS:]


async def find_request(args: argparse.Namespace, request_id: str) -> Any:
    """The routing record of `request_id` in MOTOR_REQ (by the coordinator's id: one direct
    read; by a client's x-request-id: a scan of the stream), or None."""
    from nats.js.api import DeliverPolicy
    from nats.js.errors import NotFoundError

    from core.errors import SubjectError
    from core.requestlog import ALL_REQUESTS, REQ_STREAM, RequestRecorded, subject_of
    from streams.connection import connect

    nc = await asyncio.wait_for(connect(nats_options(args), name="motor-replay"), timeout=5)
    try:
        js = nc.jetstream()
        try:
            msg = await js.get_last_msg(REQ_STREAM, subject_of(request_id))
            return RequestRecorded.model_validate_json(msg.data or b"").data
        except (NotFoundError, SubjectError):
            pass
        info = await js.stream_info(REQ_STREAM)
        if not info.state.messages:
            return None
        sub = await js.subscribe(ALL_REQUESTS, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL)
        found = None
        try:
            last = info.state.last_seq
            while True:
                m = await sub.next_msg(timeout=5)
                rec = RequestRecorded.model_validate_json(m.data).data
                if rec.client_id == request_id:
                    found = rec  # the latest of that id wins
                if m.metadata.sequence.stream >= last:
                    return found
        finally:
            await sub.unsubscribe()
    finally:
        await nc.close()


def run_replay(args: argparse.Namespace, records: list[Any], skipped: list[Any] | None = None) -> int:
    """Everything after the records are loaded (also used by tests)."""
    from rich.console import Console

    from core.state import state_to_dict
    from deploy.status import status_table

    console = Console()
    state, skipped = fold_records(records, list(skipped or []))
    span = f"seq {records[0].seq}–{records[-1].seq}" if records else "empty range"
    console.print(f"replayed {len(records)} events ({span}); {len(skipped)} skipped")
    if skipped:
        # Beside --json's state on stdout, the poison goes to stderr: both stay readable.
        print_skipped(Console(stderr=True) if args.json else console, skipped)
    code = 0
    if args.explain:
        from replay.explain import explain, render

        kind, entity = args.explain
        if kind not in ("instance", "node"):
            print("motor replay: --explain KIND must be `instance` or `node`", file=sys.stderr)
            return 2
        lines = explain(records, kind, entity)
        if not lines:
            console.print(f"no events about {kind} {entity} in this range")
        else:
            console.print(f"[bold]{kind} {entity}[/], newest first:", highlight=False)
            console.print(render(lines), highlight=False, markup=False)
    if args.timeline:
        from replay.timeline import render_html

        out = Path(args.timeline)
        marks = getattr(args, "request_marks", [])
        out.write_text(render_html([*records, *marks], title=f"Motor timeline ({span})"))
        if marks:
            console.print(f"{len(marks)} request record(s) from MOTOR_REQ marked")
        console.print(f"timeline written to {out} — open it in a browser (works offline)")
    if args.verify:
        code = max(code, _verify(args, records, console))
    if args.json:
        import orjson

        sys.stdout.write(orjson.dumps(state_to_dict(state), option=orjson.OPT_INDENT_2).decode() + "\n")
    elif not args.explain and not args.timeline:
        console.print(status_table(state, state.last_ts or time.time()))
        console.print(_routing_summary(records))
    return code


def print_skipped(console: Any, skipped: list[Any], limit: int = 50) -> None:
    """The events the fold went on without: sequence, reason, why (poison is shown, never fatal)."""
    console.print("skipped events (the fold went on without them):", highlight=False)
    for s in skipped[:limit]:
        console.print(
            f"  seq {s.seq:>8}  {s.reason:<13} {s.subject}  {s.detail}", markup=False, highlight=False
        )
    if len(skipped) > limit:
        console.print(f"  … and {len(skipped) - limit} more", markup=False, highlight=False)


def _verify(args: argparse.Namespace, records: list[Any], console: Any) -> int:
    from controller.decide import decide
    from replay.verify import verify

    cfg = load_config_file(args.config)
    report = verify(records, lambda s, now: decide(s, cfg, now))
    console.print(
        f"verify: {report.checked} logged decisions, {report.verified} reproduced "
        f"({report.late} on a fold that had not reached what landed just before them), "
        f"{report.unverifiable} depend on heartbeats (not in the log), {len(report.mismatches)} differ"
    )
    for m in report.mismatches[:50]:
        console.print(m.render(), markup=False, highlight=False)
    return 0 if report.ok else 3


def _routing_summary(records: list[Any]) -> str:
    """What the coordinator would route to at this point (its own fold of the same events)."""
    from coordinator.table import RoutingTable
    from core.events import Role

    table = RoutingTable()
    for rec in records:
        table.apply(rec.event, rec.seq)
    lines = ["coordinator routing table:"]
    models: list[str | None] = list(table.models()) or [None]
    for model in models:
        plan = table.plan(model)
        lines.append(
            f"  model {model}: plan {getattr(plan, 'kind', plan)} {getattr(plan, 'reason', '') or ''}".rstrip()
        )
        for role in (Role.UNION, Role.PREFILL, Role.DECODE):
            eps = table.candidates(role, model)
            if eps:
                lines.append(f"    {role.value}: " + ", ".join(f"{e.key}@{e.host}:{e.port}" for e in eps))
    return "\n".join(lines)
