"""`just bench controller`: heartbeat absorption and cold start of the controller.

1. Heartbeats: NODES nodes are registered, a real `motor controller` process starts (leader),
   and heartbeats of every node arrive at HB_RATE per second for HB_SECONDS. Reported: the
   controller's CPU in cores (utime+stime from /proc over the window) and the p99 of its
   heartbeat lag (publish to fold, from its own histogram; the bucket bound is reported).
2. Cold start: a log of EVENTS lifecycle events (registrations, assemblies, then churn of
   status changes, command results, faults) is published; a controller folds it from seq 1
   (no checkpoint), a checkpoint is saved, TAIL more events are published, and a controller
   starts again from the checkpoint. Measured in process, from `run()` to caught up (connect,
   checkpoint load, tail and heartbeat replay included; interpreter start-up excluded).
Last line: `BENCH controller hb_cpu_cores=... hb_lag_ms_p99=... cold_start_s=... cold_start_checkpoint_s=...`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from core import subjects
from core.codec import encode
from core.config import config_from_dict
from core.events import (
    CommandApplied,
    CommandAppliedData,
    EndpointLoad,
    EndpointSpec,
    EndpointStatus,
    EndpointStatusChanged,
    EndpointStatusChangedData,
    EventBase,
    FaultCleared,
    FaultClearedData,
    FaultReported,
    FaultReportedData,
    Heartbeat,
    HeartbeatData,
    InstanceAssembled,
    InstanceAssembledData,
    InstanceMember,
    NodeRegistered,
    NodeRegisteredData,
    Role,
)
from core.ids import derive_id
from streams.jetstream import JetStreamLog

ROOT = Path(__file__).resolve().parents[2]
T0 = time.time() - 3600


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _registration(i: int, ts: float) -> NodeRegistered:
    node = f"node-{i:05d}"
    ip = f"10.{i // 65000}.{(i // 250) % 256}.{i % 250 + 1}"
    ep = EndpointSpec(id=0, ip=ip, business_port=9000, mgmt_port=9000)
    data = NodeRegisteredData(
        node_id=node,
        job_name="bench",
        pod_ip=ip,
        role=Role.UNION,
        engine_type="builtin",
        model="motor-sim",
        endpoints=(ep,),
    )
    return NodeRegistered(id=derive_id("bench-reg", node), ts=ts, source=f"nodeagent/{node}", data=data)


def workload(n: int, nodes: int, seed: int = 11) -> Iterator[EventBase]:
    """n events of a cluster's life: registrations, assemblies, then churn."""
    rng = random.Random(seed)
    ts = T0
    produced = 0
    for i in range(nodes):
        yield _registration(i, ts)
        produced += 1
    for k in range(nodes // 2):
        members = tuple(
            InstanceMember(
                node_id=f"node-{j:05d}",
                node_rank=r,
                ip="10.0.0.1",
                endpoints=(EndpointSpec(id=0, ip="10.0.0.1", business_port=9000, mgmt_port=9000),),
            )
            for r, j in enumerate((2 * k, 2 * k + 1))
        )
        data = InstanceAssembledData(
            instance_id=k + 1,
            role=Role.UNION,
            engine_type="builtin",
            model="motor-sim",
            job_name="bench",
            members=members,
            master_dp_ip="10.0.0.1",
        )
        yield InstanceAssembled(id=derive_id("bench-asm", k), ts=ts, source="controller/bench", data=data)
        produced += 1
    open_faults: list[tuple[str, str]] = []  # bounded: operators clear what they report
    i = 0
    while produced < n:
        i += 1
        ts += 0.001
        node = f"node-{rng.randrange(nodes):05d}"
        eid = derive_id("bench", i)
        roll = rng.random()
        ev: EventBase
        if roll < 0.6:
            st = EndpointStatus.READY if rng.random() < 0.8 else EndpointStatus.ABNORMAL
            ev = EndpointStatusChanged(
                id=eid,
                ts=ts,
                source=f"nodeagent/{node}",
                data=EndpointStatusChangedData(node_id=node, endpoint_id=0, status=st),
            )
        elif roll < 0.9:
            ev = CommandApplied(
                id=eid,
                ts=ts,
                source=f"nodeagent/{node}",
                data=CommandAppliedData(command_id=derive_id("cmd", i), node_id=node, verb="start"),
            )
        elif roll < 0.95 or not open_faults:
            data_f = FaultReportedData(fault_id=f"f{i}", node_id=node, level="L2", code="Transient")  # type: ignore[arg-type]
            ev = FaultReported(id=eid, ts=ts, source="operator/bench", data=data_f)
            open_faults.append((f"f{i}", node))
        else:
            fid, fnode = open_faults.pop(rng.randrange(len(open_faults)))
            data_c = FaultClearedData(fault_id=fid, node_id=fnode)
            ev = FaultCleared(id=eid, ts=ts, source="operator/bench", data=data_c)
        yield ev
        produced += 1


async def publish_all(nc: Any, events: Iterator[EventBase], total: int) -> float:
    """Core-publish events (the stream stores them) and wait until the stream holds them all."""
    from streams.reader import stream_last_seq

    started = time.perf_counter()
    before = await stream_last_seq(nc)
    for k, ev in enumerate(events, 1):
        await nc.publish(subjects.for_event(ev), encode(ev))
        if k % 2000 == 0:
            await nc.flush()  # keep the server ahead of us
    await nc.flush()
    deadline = time.monotonic() + 600
    while await stream_last_seq(nc) < before + total:
        if time.monotonic() > deadline:
            raise RuntimeError("the stream did not take every event in time")
        await asyncio.sleep(0.2)  # polling the server's count; there is no event to await
    return time.perf_counter() - started


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _metrics(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        return await r.text()


def _sample(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _hist_p99_ms(text: str, name: str) -> float:
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    total = buckets[-1][1] if buckets else 0.0
    if not total:
        return float("nan")
    for le, count in buckets:
        if count >= 0.99 * total:
            return le * 1000
    return float("inf")


def _spawn_controller(cfg_path: Path, url: str, port: int, log: Any) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable, "-m", "deploy.cli", "controller", "--config", str(cfg_path), "--nats-url", url,
        "--port", str(port), "--log-level", "WARNING",
    ]  # fmt: skip
    return subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


async def bench_heartbeats(
    url: str, nodes: int, rate: float, seconds: float, tmp: Path, out: dict[str, Any]
) -> None:
    from streams.connection import connect
    from streams.publisher import Publisher

    cfg_path = tmp / "bench-controller.json"
    cfg_path.write_bytes(
        orjson.dumps({"union": {"instances": 1}, "controller": {"tick_interval": 0.5, "lease_ttl": 3.0}})
    )
    nc = await connect(url, name="bench-hb")
    js = nc.jetstream()
    from streams.definitions import ensure_streams

    await ensure_streams(js, lease_ttl=3.0)
    pub = Publisher(js, window=1024)
    for i in range(nodes):
        await pub.publish_async(_registration(i, time.time()))
    await pub.flush()
    port = _free_port()
    log = (tmp / "controller.log").open("wb")
    proc = _spawn_controller(cfg_path, url, port, log)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(aiohttp.ClientError):
                text = await _metrics(base)
                if (
                    f"motor_controller_nodes {float(nodes)}" in text
                    and "motor_controller_is_leader 1.0" in text
                ):
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(
                    "controller did not come up:\n" + (tmp / "controller.log").read_text()[-2000:]
                )
            await asyncio.sleep(0.2)  # polling another process
        names = [f"node-{i:05d}" for i in range(nodes)]
        loads = (EndpointLoad(id=0, status=EndpointStatus.READY, avail_slots=200, avail_blocks=900),)
        folded0 = _sample(await _metrics(base), 'motor_controller_events_folded_total{stream="MOTOR_HB"}')
        cpu0, wall0 = _cpu_seconds(proc.pid), time.monotonic()
        sent = 0
        while (elapsed := time.monotonic() - wall0) < seconds:
            due = int(elapsed * rate)
            while sent < due:
                node = names[sent % nodes]
                hb = Heartbeat(
                    id=derive_id("hb", sent),
                    ts=time.time(),
                    source=f"nodeagent/{node}",
                    data=HeartbeatData(node_id=node, endpoints=loads),
                )
                await nc.publish(subjects.heartbeat(node), encode(hb))
                sent += 1
            await asyncio.sleep(0.01)  # pacing the generator to the target rate
        await nc.flush()
        cpu1, wall1 = _cpu_seconds(proc.pid), time.monotonic()
        text = await _metrics(base)
        out["hb_sent"] = sent
        out["hb_folded"] = int(
            _sample(text, 'motor_controller_events_folded_total{stream="MOTOR_HB"}') - folded0
        )
        out["hb_rate"] = round(sent / (wall1 - wall0))
        out["hb_cpu_cores"] = round((cpu1 - cpu0) / (wall1 - wall0), 3)
        out["hb_lag_ms_p99"] = _hist_p99_ms(text, "motor_controller_heartbeat_lag_seconds")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()
        await nc.close()


async def cold_start(url: str, cfg: Any, cid: str) -> tuple[float, Any]:
    from controller.service import ControllerService

    svc = ControllerService(cfg, controller_id=cid, nats_urls=[url])
    stop = asyncio.Event()
    started = time.perf_counter()
    task = asyncio.create_task(svc.run(stop))
    waiter = asyncio.create_task(svc.caught_up.wait())
    done, _ = await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    elapsed = time.perf_counter() - started
    if task in done:
        raise RuntimeError(f"controller ended before catching up: {task.exception()}")
    state = svc.state
    stop.set()
    await task
    return elapsed, state


async def bench_cold_start(url: str, events: int, nodes: int, tail: int, out: dict[str, Any]) -> None:
    from streams.checkpoint import save_checkpoint
    from streams.connection import connect
    from streams.definitions import ensure_streams

    nc = await connect(url, name="bench-cold")
    js = nc.jetstream()
    await ensure_streams(js)
    # Not a config anyone would run: a decide that never assembles (0 instances) keeps the
    # measurement on folding, and checkpoints are saved by the bench, not by the controller.
    cfg = config_from_dict(
        {"union": {"instances": 0}, "controller": {"checkpoint_every": 10**9, "lease_ttl": 3.0}}
    )
    out["publish_s"] = round(await publish_all(nc, workload(events, nodes), events), 1)
    out["events"] = events
    out["cold_start_s"], state = await cold_start(url, cfg, "cold")
    out["cold_start_s"] = round(out["cold_start_s"], 3)
    await save_checkpoint(JetStreamLog.of(js), "controller", state)
    rng = random.Random(5)
    tail_events = (
        EndpointStatusChanged(
            id=derive_id("tail", k), ts=time.time(), source="bench",
            data=EndpointStatusChangedData(node_id=f"node-{rng.randrange(nodes):05d}", endpoint_id=0, status=EndpointStatus.READY),
        )
        for k in range(tail)
    )  # fmt: skip
    await publish_all(nc, tail_events, tail)
    seconds, state2 = await cold_start(url, cfg, "warm")
    out["cold_start_checkpoint_s"] = round(seconds, 3)
    out["checkpoint_tail"] = tail
    assert state2.last_seq >= state.last_seq + tail
    await nc.close()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="just bench controller", description=__doc__.split("\n")[0] if __doc__ else None
    )
    p.add_argument("--nodes", type=int, default=10_000, help="simulated nodes sending heartbeats")
    p.add_argument("--hb-rate", type=float, default=3300.0, help="heartbeats per second")
    p.add_argument("--hb-seconds", type=float, default=20.0, help="length of the heartbeat window")
    p.add_argument("--events", type=int, default=1_000_000, help="events in the cold-start log")
    p.add_argument("--log-nodes", type=int, default=1000, help="nodes in the cold-start log")
    p.add_argument("--tail", type=int, default=1000, help="events after the checkpoint")
    args = p.parse_args(argv)

    async def run() -> dict[str, Any]:
        from streams.server import EmbeddedNats

        out: dict[str, Any] = {}
        with tempfile.TemporaryDirectory(prefix="motor-bench-ctl-") as d:
            tmp = Path(d)
            for part in ("hb", "cold"):
                # The default lazy fsync, not Motor's `always`: fsync per message would measure
                # this machine's disk (about 700 appends/s here), not the controller.
                store = tmp / f"nats-{part}"
                lazy = f'jetstream {{\n  store_dir: "{(store / "js").resolve()}"\n  sync_interval: "2m"\n}}'
                server = EmbeddedNats(store, log_file=tmp / f"nats-{part}.log", extra_conf=lazy)
                await server.start()
                try:
                    if part == "hb":
                        await bench_heartbeats(
                            server.url, args.nodes, args.hb_rate, args.hb_seconds, tmp, out
                        )
                        print(f"heartbeats: {out['hb_sent']} from {args.nodes} nodes at {out['hb_rate']}/s "
                              f"({out['hb_folded']} folded in the window): "
                              f"controller {out['hb_cpu_cores']} cores, lag p99 <= {out['hb_lag_ms_p99']} ms", flush=True)  # fmt: skip
                    else:
                        await bench_cold_start(server.url, args.events, args.log_nodes, args.tail, out)
                        print(f"cold start: {out['events']} events published in {out['publish_s']}s; folded from seq 1 "
                              f"in {out['cold_start_s']}s, from a checkpoint + {out['checkpoint_tail']} tail events "
                              f"in {out['cold_start_checkpoint_s']}s", flush=True)  # fmt: skip
                finally:
                    await server.stop()
        return out

    out = asyncio.run(run())
    print(
        f"BENCH controller hb_cpu_cores={out['hb_cpu_cores']} hb_lag_ms_p99={out['hb_lag_ms_p99']} "
        f"cold_start_s={out['cold_start_s']} cold_start_checkpoint_s={out['cold_start_checkpoint_s']} "
        f"hb_rate={out['hb_rate']} nodes={args.nodes} events={out['events']}"
    )
    return 0
