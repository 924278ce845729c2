"""`motor up --nats-cluster 3` as a user runs it: three nats-servers with routes, the log and the
KV buckets at replicas 3, every process given all three URLs, the live lines naming the MOTOR
stream's leader; that leader killed -9 costs clients nothing, the supervisor restarts it and
it is current again; Ctrl-C stops all three."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
from pathlib import Path

import orjson

from deploy.natsauth import discover
from streams.connection import NatsOptions, connect
from streams.definitions import CHECKPOINT_BUCKET, HB_STREAM, LEADER_BUCKET, MOTOR_STREAM, kv_stream
from tests.e2e.upproc import Lines, ask, pids_with
from tests.localcluster import cluster_config, free_ports

LEADER = re.compile(r"MOTOR leader (n\d)")


def _server_pid(root: Path, name: str) -> int:
    conf = str(root / "nats" / name / "nats-server.conf").encode()
    pids = pids_with(conf)
    assert len(pids) == 1, f"{name}: processes {pids}"
    return pids[0]


def _argv(pid: int) -> list[str]:
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")]


async def test_motor_up_runs_a_three_node_jetstream_cluster_and_survives_its_leader(tmp_path: Path) -> None:
    ports = free_ports(3, nats_servers=3)
    cfg = cluster_config(
        coordinator={"port": ports.coordinator},
        controller={"port": ports.controller},
        nodeagent={"port_base": ports.nodeagent, "engine_port_base": ports.engine},
    )
    raw = cfg.model_dump(mode="json")
    raw["nats"] = {"urls": [f"nats://127.0.0.1:{ports.nats}"]}  # motor up's servers; replicas left unset
    config = tmp_path / "cluster.json"
    config.write_bytes(orjson.dumps(raw))
    root = (tmp_path / "root").resolve()
    env = {**os.environ, "COLUMNS": "250", "PYTHONPATH": os.getcwd()}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "deploy.cli",
        "up",
        "--config",
        str(config),
        "--root",
        str(root),
        "--no-live",
        "--nats-cluster",
        "3",
        "--nats-port",
        str(ports.nats),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=env,
    )
    assert proc.stdout is not None
    out = Lines(proc.stdout)
    urls = [f"nats://127.0.0.1:{ports.nats + i}" for i in range(3)]
    try:
        started = await out.wait("started", 60)
        assert "a NATS cluster of 3" in started and ",".join(urls) in started
        await out.wait("ready in", 90)
        base = f"http://127.0.0.1:{ports.coordinator}/v1"
        assert await ask(base)
        leader_line = await out.wait("MOTOR leader", 30)
        leader = LEADER.search(leader_line)
        assert leader is not None, leader_line
        assert "(R3)" in leader_line

        # Every Motor process was given all three URLs.
        marker = str(root / "cluster.json").encode()
        motor_pids = pids_with(marker)
        assert len(motor_pids) >= 6  # two controllers, a coordinator, three node agents
        for pid in motor_pids:
            argv = _argv(pid)
            assert argv[argv.index("--nats-url") + 1] == ",".join(urls), argv

        creds = discover(root, "inspect", None)
        assert creds is not None
        nc = await connect(NatsOptions.from_credentials(creds, urls), name="e2e-r3")
        try:
            js = nc.jetstream()
            for stream in (MOTOR_STREAM, HB_STREAM, kv_stream(LEADER_BUCKET), kv_stream(CHECKPOINT_BUCKET)):
                info = await js.stream_info(stream)
                assert info.config.num_replicas == 3, stream
        finally:
            await nc.close()
        for name in ("n1", "n2", "n3"):
            assert (root / "nats" / name / "jetstream").is_dir()

        # The leader of the log killed -9: clients notice nothing; it comes back current.
        victim = leader.group(1)
        os.kill(_server_pid(root, victim), signal.SIGKILL)
        for _ in range(5):
            assert await ask(base)
        await out.wait(f"restarted nats-{victim} (exit -9)", 30)
        for _ in range(60):
            line = await out.wait("MOTOR leader", 10)
            out.seen.remove(line)  # wait for the next one
            back = f"{victim} current" in line or f"MOTOR leader {victim}" in line
            if back and "lag" not in line and "offline" not in line:
                break
        else:
            raise AssertionError(f"{victim} never current again: {out.seen[-5:]}")
        assert await ask(base)

        proc.send_signal(signal.SIGINT)
        line = await out.wait("stopped", 60)
        assert "3 nats-servers" in line
        assert await asyncio.wait_for(proc.wait(), 30) == 0
        for name in ("n1", "n2", "n3"):
            assert pids_with(str(root / "nats" / name / "nats-server.conf").encode()) == []
        assert pids_with(marker) == []
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        for pid in pids_with(str(root).encode()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
