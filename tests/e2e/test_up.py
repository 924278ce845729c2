"""`motor up` itself, as a user runs it: two coordinator replicas on one port; one killed -9 is
restarted by the supervisor and the status lines say so; one frozen (SIGSTOP) is killed by its
liveness probe and restarted; Ctrl-C stops everything for good."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path

import aiohttp
import orjson

from deploy.liveness import probe_unix
from deploy.supervise import Backoff
from streams.server import EmbeddedNats
from tests.e2e.upproc import Lines, ask, new_pid_of, pid_of, pids_with
from tests.localcluster import cluster_config, free_ports


def probe_socket_of(pid: int) -> str:
    """The `--probe-socket` motor up gave a coordinator replica, read from its command line."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return os.fsdecode(argv[argv.index(b"--probe-socket") + 1])


async def test_motor_up_restarts_a_killed_or_frozen_coordinator_replica_and_stops_on_ctrl_c(
    tmp_path: Path,
) -> None:
    ports = free_ports(1)
    cfg = cluster_config(
        prefill=None,
        decode=None,
        # Both replicas share the management port too (seed 001's manage port).
        coordinator={"port": ports.coordinator, "mgmt_port": ports.coordinator + 5},
        controller={"port": ports.controller},
        nodeagent={"port_base": ports.nodeagent, "engine_port_base": ports.engine},
    )
    config = tmp_path / "cluster.json"
    config.write_bytes(orjson.dumps(cfg.model_dump(mode="json")))
    nats = EmbeddedNats(tmp_path / "nats")
    await nats.start()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "deploy.cli",
        "up",
        "--config",
        str(config),
        "--nats-url",
        nats.url,
        "--root",
        str(tmp_path / "root"),
        "--no-live",
        "--coordinators",
        "2",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "COLUMNS": "250", "PYTHONPATH": os.getcwd()},
    )
    assert proc.stdout is not None
    out = Lines(proc.stdout)
    # `motor up` hands its children the config it writes under --root.
    marker = (tmp_path / "root").resolve() / "cluster.json"
    try:
        assert "2 coordinators" in await out.wait("started", 60)
        await out.wait("ready in", 90)
        base = f"http://127.0.0.1:{ports.coordinator}/v1"
        assert await ask(base)
        mgmt = f"http://127.0.0.1:{ports.coordinator + 5}"
        async with aiohttp.ClientSession() as s:
            for _ in range(4):  # new connections: either replica may answer
                async with s.get(mgmt + "/liveness", headers={"Connection": "close"}) as r:
                    assert r.status == 200
        victim = pid_of(marker, "coordinator-1")
        os.kill(victim, signal.SIGKILL)
        # The other replica serves on the same port meanwhile.
        assert await ask(base)
        first = Backoff().initial
        line = await out.wait("restarted coordinator-1", 30)
        assert f"restarted coordinator-1 (exit -9) after {first:g} s, 1 restart" in line
        assert await new_pid_of(marker, "coordinator-1", victim) != victim
        assert await ask(base)
        assert not [line for line in out.seen if "coordinator-2 exited" in line], out.seen
        # Frozen, a replica keeps its socket in the port: its probe kills it and a fresh one
        # starts. First the restarted coordinator-1 must be in the port (it answers its own
        # probe socket once caught up, just before it joins): else nothing would serve.
        sock = probe_socket_of(pid_of(marker, "coordinator-1"))
        deadline = asyncio.get_running_loop().time() + 60
        while not await probe_unix(sock, 1.0):
            assert asyncio.get_running_loop().time() < deadline, (
                f"the restarted coordinator-1 never answered on {sock}"
            )
            await asyncio.sleep(0.1)
        frozen = pid_of(marker, "coordinator-2")
        os.kill(frozen, signal.SIGSTOP)
        line = await out.wait("coordinator-2 stopped answering its liveness probe", 15)
        assert "3 probes in a row unanswered" in line
        await out.wait("restarted coordinator-2 (exit -9)", 30)
        assert await new_pid_of(marker, "coordinator-2", frozen) != frozen
        assert await ask(base)
        proc.send_signal(signal.SIGINT)
        await out.wait("stopped", 60)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        # Deliberately stopped: nothing comes back, engines included.
        await asyncio.sleep(4 * first)
        assert pids_with(str(marker).encode()) == []
        assert pids_with(str(ports.engine).encode()) == []
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)  # motor up stops what it started, engines too
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for pid in pids_with(str(marker).encode()) + pids_with(str(ports.engine).encode()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await nats.stop()
