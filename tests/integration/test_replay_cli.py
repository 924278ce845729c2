"""`motor replay` and the operator commands against a real nats-server (CLI as a subprocess)."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from nats.js import JetStreamContext

from core.events import (
    CausedBy,
    FaultReported,
    FaultReportedData,
    InstanceStateChanged,
    InstanceStateChangedData,
)
from deploy.cmd_replay import parse_time
from streams.publisher import Publisher
from streams.server import EmbeddedNats
from tests.unit.factories import assembled, ep_status, registered, start_cmd

ROOT = Path(__file__).resolve().parents[2]


async def motor(*args: str, url: str) -> tuple[int, str, str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "deploy.cli",
        *args,
        "--nats-url",
        url,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def incident(js: JetStreamContext) -> tuple[list[int], float]:
    """A small incident: node n7 in instance 3 goes ACTIVE, then a fault isolates it.

    Returns the sequences and a wall-clock moment between ACTIVE and the fault.
    """
    pub = Publisher(js)
    seqs = [
        await pub.publish(registered("n7", ts=1000.0)),
        await pub.publish(assembled(3, ["n7"], ts=1001.0)),
        await pub.publish(start_cmd("n7", 3, ts=1002.0)),
        await pub.publish(ep_status("n7", "READY", ts=1003.0, instance_id=3)),
        await pub.publish(
            InstanceStateChanged(
                id="act",
                ts=1004.0,
                source="controller/c1",
                data=InstanceStateChangedData(instance_id=3, state="ACTIVE"),
            )
        ),
    ]
    await asyncio.sleep(0.05)
    between = time.time()
    await asyncio.sleep(0.05)
    fault = FaultReported(
        id="flt",
        ts=1010.0,
        source="operator/cli",
        data=FaultReportedData(
            fault_id="f-1", node_id="n7", level="L5", code="CardUnhealthy", kind="hardware"
        ),
    )
    fseq = await pub.publish(fault)
    iso = InstanceStateChanged(
        id="iso",
        ts=1011.0,
        source="controller/c1",
        caused_by=CausedBy(id="flt", seq=fseq),
        data=InstanceStateChangedData(
            instance_id=3, state="ISOLATED", previous="ACTIVE", reason="fault L5 CardUnhealthy"
        ),
    )
    return [*seqs, fseq, await pub.publish(iso)], between


async def test_replay_points_in_time_and_explain(
    js: JetStreamContext, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    seqs, between = await incident(js)
    url = nats_server.url
    rc, out, err = await motor("replay", "--json", url=url)
    assert rc == 0, err
    state = orjson.loads(out[out.index("{") :])
    assert state["instances"]["3"]["state"] == "ISOLATED"
    # Just before the fault: ACTIVE, no fault.
    rc, out, err = await motor("replay", "--json", "--until-seq", str(seqs[4]), url=url)
    state = orjson.loads(out[out.index("{") :])
    assert state["instances"]["3"]["state"] == "ACTIVE" and not state["faults"]
    # The same point by time (ISO 8601, UTC).
    iso = datetime.fromtimestamp(between, tz=UTC).replace(tzinfo=None).isoformat()
    rc, out, err = await motor("replay", "--json", "--until-time", iso, url=url)
    assert rc == 0, err
    state = orjson.loads(out[out.index("{") :])
    assert state["instances"]["3"]["state"] == "ACTIVE"
    # The default view: the status table and the coordinator's routing table.
    rc, out, err = await motor("replay", url=url)
    assert rc == 0, err
    assert "Motor cluster" in out and "coordinator routing table" in out
    rc, out, err = await motor("replay", "--explain", "instance", "3", url=url)
    assert rc == 0, err
    first = out.split("newest first:", 1)[1]
    assert "ISOLATED" in first.splitlines()[1]
    assert f"← fault.reported L5 CardUnhealthy on n7, seq {seqs[5]}" in first


async def test_fault_and_precision_commands_append_events(
    js: JetStreamContext, nats_server: EmbeddedNats
) -> None:
    url = nats_server.url
    await incident(js)
    rc, out, err = await motor(
        "fault", "report", "--node", "n7", "--level", "L3", "--code", "EngineHang", url=url
    )
    assert rc == 0 and "reported on n7 (L3 EngineHang)" in out, err
    rc, out, err = await motor("fault", "clear", "--node", "n7", url=url)
    assert rc == 0 and out.count("cleared") == 2, out  # the L5 from the incident and the L3
    rc, out, err = await motor("precision", "raise", "--d-instance", "3", url=url)
    assert rc == 0 and "raised on d 3" in out, err
    rc, out, err = await motor("replay", "--json", url=url)
    state = orjson.loads(out[out.index("{") :])
    assert not state["faults"] and "3" in state["alarms"]
    rc, out, err = await motor("precision", "clear", "--d-instance", "3", url=url)
    assert rc == 0, err
    rc, out, err = await motor("fault", "clear", "--fault-id", "nope", url=url)
    assert rc == 2 and "no open fault 'nope'" in err


async def test_unreachable_server_is_one_clear_line() -> None:
    for args in (
        ("replay",),
        ("status",),
        ("fault", "report", "--node", "n1", "--level", "L1", "--code", "X"),
    ):
        rc, _out, err = await motor(*args, url="nats://127.0.0.1:1")
        assert rc == 1, (args, err)
        assert "motor up" in err and "Traceback" not in err, (args, err)


def test_parse_time_forms() -> None:
    assert parse_time("1000.5") == 1000.5
    assert parse_time("1970-01-01T00:16:40") == 1000.0
    assert parse_time("1970-01-01T01:16:40+01:00") == 1000.0


async def poison(js: JetStreamContext) -> dict[int, str]:
    """Issue 11's poison events after a healthy incident; seq -> the reason a fold skips it for."""
    from core.codec import encode
    from core.events import InstancesRefreshed, InstancesRefreshedData

    body = orjson.loads(encode(registered("n8", ts=1020.0)))
    out: dict[int, str] = {}
    ack = await js.publish("motor.evt.node.n8", b"{not json")
    out[ack.seq] = "undecodable"
    ack = await js.publish("motor.evt.node.n8", orjson.dumps(body | {"id": "u", "type": "node.exploded"}))
    out[ack.seq] = "unknown_type"
    ack = await js.publish("motor.evt.node.n8", orjson.dumps(body | {"id": "v", "schema_version": 99}))
    out[ack.seq] = "newer_schema"
    ack = await js.publish(
        "motor.evt.node.n8", orjson.dumps(body | {"id": "w", "ts": "@"}).replace(b'"@"', b"Infinity")
    )
    out[ack.seq] = "undecodable"
    # Decodable, and the reducer ignores its entry without an id (it raised KeyError before).
    no_id = InstancesRefreshed(
        id="r",
        ts=1021.0,
        source="rogue",
        data=InstancesRefreshedData(event="add", ids=(), instances=({"ip": "x"},)),
    )
    await Publisher(js).publish(no_id)
    return out


async def test_replay_shows_poison_events_instead_of_a_traceback(
    js: JetStreamContext, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    await incident(js)
    bad = await poison(js)
    url = nats_server.url
    rc, out, err = await motor("replay", url=url)
    assert rc == 0 and "Traceback" not in out + err, err
    assert f"{len(bad)} skipped" in out and "skipped events (the fold went on without them)" in out
    for seq, reason in bad.items():
        assert any(line.split()[:3] == ["seq", str(seq), reason] for line in out.splitlines()), (
            seq,
            reason,
            out,
        )
    rc, out, err = await motor("replay", "--json", url=url)
    assert rc == 0 and "Traceback" not in err
    assert orjson.loads(out[out.index("{") :])["instances"]["3"]["state"] == "ISOLATED"
    assert "skipped events" in err
    # The same from an export.
    export = tmp_path / "incident.jsonl"
    rc, _, err = await motor("events", "export", str(export), url=url)
    assert rc == 0, err
    rc, out, err = await motor("replay", "--from-file", str(export), url=url)
    assert rc == 0 and "Traceback" not in out + err, err
    assert f"{len(bad)} skipped" in out and all(f"seq {s:>8}  {r}" in out for s, r in bad.items())


def test_replay_folds_past_an_event_the_reducer_cannot_apply(monkeypatch: Any, capsys: Any) -> None:
    """Whatever still raises in the reducer is `inapplicable`: listed, dropped, and the rest folded."""
    import argparse

    import core.handlers
    from core.events import StartCommand
    from deploy.cmd_replay import run_replay
    from streams.reader import Record

    def boom(*_: Any) -> Any:
        raise KeyError("id")

    monkeypatch.setitem(core.handlers.HANDLERS, StartCommand, boom)
    records = [
        Record("MOTOR", 1, "motor.evt.node.n7", registered("n7", ts=1000.0)),
        Record("MOTOR", 2, "motor.evt.instance.3", assembled(3, ["n7"], ts=1001.0)),
        Record("MOTOR", 3, "motor.cmd.n7.start", start_cmd("n7", 3, ts=1002.0)),
        Record("MOTOR", 4, "motor.evt.endpoint.n7", ep_status("n7", "READY", ts=1003.0, instance_id=3)),
    ]
    args = argparse.Namespace(explain=None, timeline=None, verify=False, json=True, config=None)
    assert run_replay(args, records, []) == 0
    out, err = capsys.readouterr()
    state = orjson.loads(out[out.index("{") :])
    assert state["last_seq"] == 4 and "3" in state["instances"]
    assert "seq        3  inapplicable  motor.cmd.n7.start  KeyError: 'id'" in err
