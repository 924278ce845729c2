"""The CLI side of the seed work: `motor config import|check` on MindIE files, and
`motor fault report` picking the level from the fault-code table."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import orjson
from nats.aio.client import Client
from nats.js import JetStreamContext

from core.configfile import parse_config
from core.events import FaultLevel, FaultReported
from core.mindie import config_from_mindie
from streams.definitions import MOTOR_STREAM
from streams.reader import read_range
from streams.server import EmbeddedNats

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "mindie"


def motor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "deploy.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={**os.environ, "NO_COLOR": "1"},
    )  # fmt: skip


def test_config_import_writes_motor_yaml_that_loads_to_the_same_cluster(tmp_path: Path) -> None:
    user, env = DATA / "pd" / "user_config.json", DATA / "pd" / "env.json"
    out = motor("config", "import", str(user), "--env", str(env))
    assert out.returncode == 0, out.stderr
    assert "accepted, not used" in out.stderr and out.stderr.count("motor_deploy_config.image_name") == 1
    (tmp_path / "motor.yaml").write_text(out.stdout)
    via_yaml = parse_config(out.stdout, "motor.yaml")
    direct, _ = config_from_mindie(orjson.loads(user.read_bytes()), orjson.loads(env.read_bytes()))
    assert via_yaml == direct
    check = motor("config", "check", str(tmp_path / "motor.yaml"))
    assert check.returncode == 0 and "prefill×2, decode×1" in check.stdout


def test_config_check_reads_a_mindie_file_directly() -> None:
    out = motor("config", "check", str(DATA / "multinode" / "user_config.json"))
    assert out.returncode == 0 and "prefill×1, decode×1" in out.stdout, out.stderr


def test_a_bad_mindie_file_is_an_error_naming_the_field_not_a_traceback(tmp_path: Path) -> None:
    raw = orjson.loads((DATA / "hybrid" / "user_config.json").read_bytes())
    raw["motor_engine_union_config"]["health_check_config"]["health_collector_timout"] = 5  # typo
    bad = tmp_path / "user_config.json"
    bad.write_bytes(orjson.dumps(raw))
    for args in (("config", "import", str(bad)), ("config", "check", str(bad)), ("up", "--config", str(bad))):
        out = motor(*args)
        assert out.returncode == 2, (args, out.stderr)
        assert (
            "motor_engine_union_config.health_check_config.health_collector_timout: unknown field"
            in out.stderr
        )
        assert "Traceback" not in out.stderr
    out = motor("config", "import", str(DATA / "nope.json"))
    assert out.returncode == 2 and "cannot read" in out.stderr
    out = motor("up", "--config", str(tmp_path / "user_config.json"), "--env", str(tmp_path / "missing.json"))
    assert out.returncode == 2 and "Traceback" not in out.stderr


async def test_fault_report_takes_the_level_from_the_code_table(
    nats_server: EmbeddedNats, nc: Client, js: JetStreamContext
) -> None:
    url = nats_server.url
    for code, level in (("0x0000001", FaultLevel.L6), ("CardUnhealthy", FaultLevel.L6)):
        out = await asyncio.to_thread(
            motor, "fault", "report", "--node", "n1", "--code", code, "--nats-url", url
        )
        assert out.returncode == 0 and f"({level} " in out.stdout, out.stderr
    out = await asyncio.to_thread(
        motor,
        "fault",
        "report",
        "--node",
        "n1",
        "--code",
        "CardUnhealthy",
        "--handling",
        "RestartNPU",
        "--nats-url",
        url,
    )
    assert out.returncode == 0 and "(L5 CardUnhealthy)" in out.stdout, out.stderr
    out = await asyncio.to_thread(
        motor, "fault", "report", "--node", "n1", "--code", "VendorX", "--nats-url", url
    )
    assert out.returncode == 2 and "give a level" in out.stderr
    records = [r async for r in read_range(nc, MOTOR_STREAM)]
    faults = [r.event.data for r in records if isinstance(r.event, FaultReported)]
    assert [(f.code, f.level, f.kind) for f in faults] == [
        ("NODE_REBOOT", FaultLevel.L6, "hardware"),
        ("CardUnhealthy", FaultLevel.L6, "hardware"),
        ("CardUnhealthy", FaultLevel.L5, "hardware"),
    ]
