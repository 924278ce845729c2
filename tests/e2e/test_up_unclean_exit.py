"""`motor up` dying uncleanly leaves no orphan (issue 24): killed -9, its children are told by
the kernel (PR_SET_PDEATHSIG) and stop as on Ctrl-C, node agents stopping their engines first;
its terminal closing (SIGHUP) stops everything in order."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import orjson
import pytest

from tests.e2e.upproc import Lines, ask, pids_with
from tests.localcluster import cluster_config, free_ports


async def _up(tmp_path: Path) -> tuple[asyncio.subprocess.Process, Lines, Path, int, int]:
    ports = free_ports(1)
    cfg = cluster_config(
        prefill=None,
        decode=None,
        coordinator={"port": ports.coordinator},
        controller={"port": ports.controller},
        nodeagent={"port_base": ports.nodeagent, "engine_port_base": ports.engine},
    )
    config = tmp_path / "cluster.json"
    config.write_bytes(orjson.dumps(cfg.model_dump(mode="json")))
    root = (tmp_path / "root").resolve()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "deploy.cli", "up", "--config", str(config), "--root", str(root),
        "--no-live", "--nats-port", str(ports.nats),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "250", "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert proc.stdout is not None
    out = Lines(proc.stdout)
    await out.wait("ready in", 90)
    assert await ask(f"http://127.0.0.1:{ports.coordinator}/v1")
    return proc, out, root, ports.engine, ports.nats


def _left(root: Path, engine_port: int) -> list[int]:
    """Processes of this cluster still running: Motor's (their argv names the root), engines."""
    return sorted(set(pids_with(str(root / "cluster.json").encode())) | set(pids_with(str(engine_port).encode())) | set(pids_with(str(root / "nats" / "nats-server.conf").encode())))  # fmt: skip


async def _none_left(root: Path, engine_port: int, within: float) -> list[int]:
    deadline = time.monotonic() + within
    left = _left(root, engine_port)
    while left and time.monotonic() < deadline:
        await asyncio.sleep(0.2)  # processes exiting: /proc has nothing to await
        left = _left(root, engine_port)
    return left


@pytest.mark.parametrize("how", ["SIGKILL", "SIGHUP"])
async def test_motor_up_dying_uncleanly_leaves_no_process_behind(tmp_path: Path, how: str) -> None:
    proc, out, root, engine_port, _ = await _up(tmp_path)
    try:
        before = _left(root, engine_port)
        assert len(before) >= 5, before  # nats-server, controllers, coordinator, agent, engine
        proc.send_signal(getattr(signal, how))
        code = await asyncio.wait_for(proc.wait(), 60)
        if how == "SIGHUP":
            await out.wait("stopped", 5)
            assert code == 0
        else:
            assert code == -signal.SIGKILL
        left = await _none_left(root, engine_port, within=30)
        assert left == [], f"still running after motor up's {how}: {left}"
    finally:
        for pid in _left(root, engine_port):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
