"""`motor up --config user_config.json --env env.json`: a MindIE-Motor file runs as it is.

The file is recognised by its blocks, mapped, its unused fields listed once on stderr, and the
cluster serves the served model name on the infer port, the management API on the manage
port, with the engine environment from env.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import orjson
import pytest
from nats.js import JetStreamContext

from streams.server import EmbeddedNats
from tests.localcluster import engine_pid, free_ports

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(240)


def start_up(tmp: Path, nats_url: str, err_log: Path) -> subprocess.Popen[bytes]:
    """`motor up` on the files in `tmp`, against the test's NATS, in its own session."""
    with open(err_log, "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "up", "--config", str(tmp / "user_config.json"),
             "--env", str(tmp / "env.json"), "--nats-url", nats_url, "--root", str(tmp / "motor"),
             "--no-live", "--no-standby"],
            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip


def environ_of(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


async def test_motor_up_runs_a_mindie_user_config(
    tmp_path: Path, nats_server: EmbeddedNats, js: JetStreamContext
) -> None:
    ports = free_ports(1)
    user = {
        "version": "v2.0",
        "motor_deploy_config": {"hybrid_instances_num": 1, "job_id": "e2e-mindie", "image_name": "x:latest"},
        "motor_controller_config": {
            "api_config": {"controller_api_host": "127.0.0.1", "controller_api_port": ports.controller},
            "instance_config": {"instance_heartbeat_timeout": 5},
            "logging_config": {"log_level": "INFO"},
        },
        "motor_coordinator_config": {
            "api_config": {
                "coordinator_api_host": "127.0.0.1",
                "coordinator_api_infer_port": ports.coordinator,
                "coordinator_api_mgmt_port": ports.nats_monitor,
            },
        },
        "motor_nodemanger_config": {
            "api_config": {"pod_ip": "127.0.0.1", "node_manager_port": ports.nodeagent},
            "endpoint_config": {"base_port": ports.engine},
            "basic_config": {"heartbeat_interval_seconds": 0.5},
        },
        "motor_engine_union_config": {
            "engine_type": "builtin",
            "engine_config": {"served_model_name": "mindie-sim", "fast": True},
            "health_check_config": {"health_collector_timeout": 2, "startup_timeout": 60},
        },
    }
    env = {"motor_engine_union_env": {"MOTOR_MINDIE_E2E": 42}}
    (tmp_path / "user_config.json").write_bytes(orjson.dumps(user))
    (tmp_path / "env.json").write_bytes(orjson.dumps(env))
    err_log = tmp_path / "up.stderr"
    proc = start_up(tmp_path, nats_server.url, err_log)
    try:
        base = f"http://127.0.0.1:{ports.coordinator}"
        body = {"model": "mindie-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        deadline = time.monotonic() + 120
        status = 0
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline and status != 200:
                assert proc.poll() is None, err_log.read_text()
                with contextlib.suppress(aiohttp.ClientError):
                    async with s.post(f"{base}/v1/chat/completions", json=body) as r:
                        status = r.status
                await asyncio.sleep(0.3)
            assert status == 200, err_log.read_text()
            async with s.get(f"http://127.0.0.1:{ports.nats_monitor}/readiness") as r:
                assert r.status == 200  # the manage port
        stderr = err_log.read_text()
        assert stderr.count("motor_deploy_config.image_name") == 1  # reported once
        assert "accepted, not used" in stderr and "Traceback" not in stderr
        assert b"MOTOR_MINDIE_E2E=42" in environ_of(engine_pid(ports.engine))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
