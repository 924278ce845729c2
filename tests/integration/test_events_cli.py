"""`motor events` end to end: a test publishes, the CLI (a real subprocess) shows it."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import orjson
from nats.aio.client import Client
from nats.js import JetStreamContext

from core.codec import encode
from streams.definitions import MOTOR_STREAM
from streams.publisher import Publisher
from streams.reader import read_range
from streams.server import EmbeddedNats
from tests.integration.streams_events import mixed

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 60.0


async def motor(*args: str, url: str) -> tuple[int, str, str]:
    """Run `python -m deploy.cli events ARGS` and return (exit code, stdout, stderr)."""
    env = {**os.environ, "COLUMNS": "220", "MOTOR_NATS_URL": url, "NO_COLOR": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "deploy.cli",
        "events",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_ls_and_view_show_published_events(js: JetStreamContext, nats_server: EmbeddedNats) -> None:
    events = mixed(12)
    pub = Publisher(js)
    for ev in events:
        await pub.publish(ev)

    rc, out, err = await motor("ls", url=nats_server.url)
    assert rc == 0, err
    motor_line = next(line for line in out.splitlines() if line.strip().startswith(f"{MOTOR_STREAM} "))
    assert motor_line.split()[1:2] == ["12"]  # messages

    rc, out, err = await motor("view", url=nats_server.url)
    assert rc == 0, err
    assert f"{MOTOR_STREAM}: 12 events" in out
    assert "endpoint.status_changed" in out and "fault.reported" in out
    assert "motor.evt.endpoint.n0" in out

    rc, out, err = await motor(
        "view", "--json", "--since", "3", "--subject", "motor.evt.endpoint.>", url=nats_server.url
    )
    assert rc == 0, err
    rows = [orjson.loads(line) for line in out.splitlines()]
    want = [ev for i, ev in enumerate(events, 1) if i >= 3 and ev.type == "endpoint.status_changed"]
    assert [r["event"] for r in rows] == [orjson.loads(encode(ev)) for ev in want]
    assert all(r["subject"].startswith("motor.evt.endpoint.") for r in rows)

    rc, out, err = await motor("view", "--json", "--last", "2", url=nats_server.url)
    assert rc == 0, err
    assert [orjson.loads(line)["seq"] for line in out.splitlines()] == [11, 12]


async def test_export_then_import_through_the_cli(
    js: JetStreamContext, nc: Client, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    events = mixed(10)
    pub = Publisher(js)
    for ev in events:
        await pub.publish(ev)
    path = tmp_path / "incident.jsonl"

    rc, _, err = await motor("export", str(path), url=nats_server.url)
    assert rc == 0, err
    assert "exported 10 messages" in err
    await js.delete_stream(MOTOR_STREAM)
    rc, _, err = await motor("import", str(path), url=nats_server.url)
    assert rc == 0, err
    assert "imported 10 messages" in err
    assert [r.event async for r in read_range(nc)] == events


async def test_sub_prints_live_messages(js: JetStreamContext, nats_server: EmbeddedNats) -> None:
    env = {**os.environ, "MOTOR_NATS_URL": nats_server.url}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "deploy.cli",
        "events",
        "sub",
        "motor.evt.>",
        "--count",
        "2",
        "--json",
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None
        # The CLI says when its subscription is in place; publish only then.
        # (Other lines, e.g. a warning, may come first.)
        seen: list[bytes] = []
        while not seen or b"listening on motor.evt.>" not in seen[-1]:
            line = await asyncio.wait_for(proc.stderr.readline(), TIMEOUT)
            assert line, f"sub exited before listening: {b''.join(seen)!r}"
            seen.append(line)
        events = mixed(2)
        pub = Publisher(js)
        for ev in events:
            await pub.publish(ev)
        out, _ = await asyncio.wait_for(proc.communicate(), TIMEOUT)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0
    assert [orjson.loads(line)["event"]["id"] for line in out.splitlines()] == [ev.id for ev in events]


async def test_unreachable_server_is_one_line_naming_motor_up(tmp_path: Path) -> None:
    # A port nobody listens on: bind one, close it, use it.
    server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()

    rc, out, err = await motor("ls", url=f"nats://127.0.0.1:{port}")

    assert rc == 1
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert "motor up" in err and f"127.0.0.1:{port}" in err
    assert "Traceback" not in err


async def test_bad_since_names_the_flag(nats_server: EmbeddedNats) -> None:
    rc, _, err = await motor("view", "--since", "yesterday", url=nats_server.url)
    assert rc == 2
    assert "--since 'yesterday'" in err and "Traceback" not in err


async def test_view_marks_what_a_fold_skips_and_why(js: JetStreamContext, nats_server: EmbeddedNats) -> None:
    good = mixed(2)
    await Publisher(js).publish(good[0])
    await js.publish("motor.evt.node.x", b"{not json")
    body = orjson.loads(encode(good[1]))
    await js.publish("motor.evt.node.x", orjson.dumps(body | {"id": "u1", "type": "node.teleported"}))
    await js.publish("motor.evt.node.x", orjson.dumps(body | {"id": "v9", "schema_version": 99}))
    rc, out, err = await motor("view", url=nats_server.url)
    assert rc == 0 and "Traceback" not in err, err
    assert "(not JSON) SKIPPED: undecodable" in out
    assert "node.teleported SKIPPED: unknown_type" in out
    assert "SKIPPED: newer_schema" in out and out.count("SKIPPED") == 3
    rc, out, err = await motor("view", "--json", url=nats_server.url)
    rows = [orjson.loads(line) for line in out.splitlines()]
    assert [r.get("skipped", {}).get("reason") for r in rows] == [
        None,
        "undecodable",
        "unknown_type",
        "newer_schema",
    ]


async def test_acked_says_every_acknowledged_event_is_in_the_log_and_names_one_that_is_not(
    js: JetStreamContext, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    from streams.ackjournal import AckJournal

    journal = tmp_path / "acks"
    pub = Publisher(js, journal=AckJournal(journal / "p.jsonl"))
    events = mixed(6)
    seqs = [await pub.publish(ev) for ev in events]

    rc, out, err = await motor("acked", str(journal), url=nats_server.url)
    assert rc == 0, err
    assert "6 acknowledged events of MOTOR: every one is in the log" in out

    await js.delete_msg(MOTOR_STREAM, seqs[2])  # what a lost disk or a bad failover would do
    rc, out, err = await motor("acked", str(journal), "--json", url=nats_server.url)
    assert rc == 1, err
    result = orjson.loads(out)
    assert result["acked"] == 6 and [m["id"] for m in result["missing"]] == [events[2].id]

    rc, out, err = await motor("acked", str(tmp_path / "nowhere"), url=nats_server.url)
    assert rc == 2 and "MOTOR_ACK_JOURNAL" in err
