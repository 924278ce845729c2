"""`just bench coordinator`: CPU per request of the coordinator's hop against the Rust routers.

Layout (2 cores): wrk and the builtin engines (`--fast`) pinned to core 0, the router under
test to core 1. Targets: direct (no hop), the coordinator (single hop and P/D handoff, full
routing: policies, load accounting, metrics), vllm-router (regular and P/D) and sglang-router.
JSON and SSE (16 tokens) at concurrency 64; SSE at concurrency 1 for the added p50. Rounds are
interleaved so drift hits every target alike. CPU is read from /proc for each router's process
tree. wrk comes from Debian (installed here if missing), the routers from the `bench` extra.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODEL = "motor-sim"
MODEL_PD = "motor-sim-pd"  # served by the P/D pair only, so the coordinator's plan for it is P/D
TOKENS = 16
ROUTER_CORE, LOAD_CORE = "1", "0"
ROUTERS = {"vllm-router": "vllm-router==0.1.17", "sglang-router": "sglang-router==0.3.2"}


# ---------------------------------------------------------------------------- tools


def ensure_tools() -> None:
    """wrk from Debian and the routers from PyPI, installed when missing."""
    if shutil.which("wrk") is None:
        print("installing wrk (apt-get)", flush=True)
        subprocess.run(["apt-get", "update", "-q"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "-q", "wrk"], check=True, stdout=subprocess.DEVNULL)
    bindir = Path(sys.executable).parent
    missing = [
        spec for name, spec in ROUTERS.items() if not (bindir / name).exists() and not shutil.which(name)
    ]
    if missing:
        print(f"installing {', '.join(missing)} (the bench extra)", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)


def router_bin(name: str) -> str:
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------- processes


@dataclass
class Proc:
    name: str
    proc: subprocess.Popen[bytes]
    port: int

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(10)


def spawn(name: str, core: str, argv: Sequence[str], port: int, logdir: Path) -> Proc:
    log = (logdir / f"{name}.log").open("ab")
    proc = subprocess.Popen(
        ["taskset", "-c", core, *argv],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "RUST_LOG": "error"},
    )
    return Proc(name, proc, port)


def tree_cpu(pid: int) -> float:
    """CPU seconds (user + system) of `pid` and every live descendant."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, tuple[int, int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        ppid = int(fields[1])
        children.setdefault(ppid, []).append(int(entry))
        stats[int(entry)] = (int(fields[11]), int(fields[12]))
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        ut, st = stats.get(p, (0, 0))
        total += ut + st
        todo.extend(children.get(p, []))
    return total / tick


async def wait_ok(url: str, method: str = "GET", body: bytes | None = None, within: float = 60.0) -> None:
    import aiohttp

    deadline = time.monotonic() + within
    last: object = None
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            try:
                async with s.request(
                    method,
                    url,
                    data=body,
                    headers={"content-type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=5),
                ) as r:
                    await r.read()
                    if r.status == 200:
                        return
                    last = r.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                last = exc
            await asyncio.sleep(0.2)
    raise TimeoutError(f"{url} not ready: {last!r}")


# ---------------------------------------------------------------------------- wrk


def lua(stream: bool, path: Path, model: str = MODEL) -> Path:
    tail = ',"stream":true' if stream else ""
    body = (
        f'{{"model":"{model}","messages":[{{"role":"user","content":"Tell me about the sea."}}],'
        f'"max_tokens":{TOKENS},"ignore_eos":true{tail}}}'
    )
    path.write_text(
        f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = \'{body}\'\n'
    )
    return path


@dataclass
class Run:
    requests: int
    errors: int
    p50_ms: float
    cpu_s: float

    @property
    def cpu_us(self) -> float:
        return self.cpu_s * 1e6 / self.requests if self.requests else float("nan")


_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text.strip())
    return float(m.group(1)) * _UNIT_MS[m.group(2)] if m else float("nan")


def wrk(url: str, script: Path, conns: int, seconds: float, pid: int | None) -> Run:
    before = tree_cpu(pid) if pid else 0.0
    out = subprocess.run(
        [
            "taskset",
            "-c",
            LOAD_CORE,
            "wrk",
            "-t1",
            f"-c{conns}",
            f"-d{seconds:g}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    after = tree_cpu(pid) if pid else 0.0
    n = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errs = 0
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        errs += int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        errs += sum(int(x) for x in m.groups())
    p50 = re.search(r"^\s*50%\s+(\S+)", out, re.MULTILINE)
    return Run(n, errs, _ms(p50.group(1)) if p50 else float("nan"), after - before)


# ---------------------------------------------------------------------------- the bench


@dataclass
class Results:
    runs: dict[str, list[Run]] = field(default_factory=dict)

    def add(self, key: str, run: Run) -> None:
        self.runs.setdefault(key, []).append(run)

    def cpu(self, key: str) -> float:
        return statistics.median(r.cpu_us for r in self.runs[key])

    def p50(self, key: str) -> float:
        return statistics.median(r.p50_ms for r in self.runs[key])


async def register(nats_url: str, engines: dict[str, Proc]) -> None:
    """Make the engines routable for the coordinator, as the controller and node agents would."""
    from nats.js import JetStreamContext

    from streams.connection import connect
    from streams.definitions import ensure_streams
    from streams.publisher import Publisher
    from tests.integration.coord_harness import Cluster

    nc = await connect(nats_url, name="bench")
    try:
        js: JetStreamContext = nc.jetstream()
        await ensure_streams(js)
        cluster = Cluster(Publisher(js))

        class _E:
            def __init__(self, p: Proc, role: str) -> None:
                self.port, self.role, self.bootstrap_port = p.port, role, None

        await cluster.add(_E(engines["union"], "union"))  # type: ignore[arg-type]
        for role in ("prefill", "decode"):
            await cluster.add(
                _E(engines[role], role),  # type: ignore[arg-type]
                engine_type="vllm",
                capabilities=["handoff"],
                model=MODEL_PD,
            )
    finally:
        await nc.close()


async def bench(args: argparse.Namespace) -> int:
    from streams.server import EmbeddedNats

    tmp = Path(tempfile.mkdtemp(prefix="motor-bench-coord-"))
    procs: list[Proc] = []
    nats = EmbeddedNats(tmp / "nats", log_file=tmp / "nats.log")
    await nats.start()
    try:
        py = [sys.executable, "-m", "deploy.cli"]
        engines: dict[str, Proc] = {}
        for role in ("union", "prefill", "decode"):
            port = free_port()
            model = MODEL if role == "union" else MODEL_PD
            argv = [*py, "engine", "builtin", "--port", str(port), "--role", role, "--model", model, "--fast"]
            engines[role] = spawn(f"engine-{role}", LOAD_CORE, argv, port, tmp)
            procs.append(engines[role])
        for e in engines.values():
            await wait_ok(f"http://127.0.0.1:{e.port}/health")
        union = f"http://127.0.0.1:{engines['union'].port}"
        pre = f"http://127.0.0.1:{engines['prefill'].port}"
        dec = f"http://127.0.0.1:{engines['decode'].port}"

        cfg = tmp / "coordinator.yaml"
        cfg.write_text("union: {instances: 1}\ncoordinator: {}\n")
        cport, vport, vpdport, sport = free_port(), free_port(), free_port(), free_port()
        targets: dict[str, Proc | None] = {"direct": None}
        coord = spawn(
            "coordinator",
            ROUTER_CORE,
            [
                *py,
                "coordinator",
                "--config",
                str(cfg),
                "--nats-url",
                nats.url,
                "--port",
                str(cport),
                "--log-level",
                "WARNING",
            ],
            cport,
            tmp,
        )
        procs.append(coord)
        vr = spawn(
            "vllm-router",
            ROUTER_CORE,
            [
                router_bin("vllm-router"),
                "--host",
                "127.0.0.1",
                "--port",
                str(vport),
                "--worker-urls",
                union,
                "--policy",
                "round_robin",
                "--log-level",
                "error",
                "--prometheus-port",
                str(free_port()),
            ],
            vport,
            tmp,
        )
        vpd = spawn(
            "vllm-router-pd",
            ROUTER_CORE,
            [
                router_bin("vllm-router"),
                "--host",
                "127.0.0.1",
                "--port",
                str(vpdport),
                "--vllm-pd-disaggregation",
                "--prefill",
                pre,
                "--decode",
                dec,
                "--policy",
                "round_robin",
                "--log-level",
                "error",
                "--prometheus-port",
                str(free_port()),
            ],
            vpdport,
            tmp,
        )
        sr = spawn(
            "sglang-router",
            ROUTER_CORE,
            [
                router_bin("sglang-router"),
                "launch",
                "--host",
                "127.0.0.1",
                "--port",
                str(sport),
                "--worker-urls",
                union,
                "--policy",
                "round_robin",
                "--log-level",
                "error",
                "--prometheus-port",  # its default (29000) is taken when two benches share a host
                str(free_port()),
            ],
            sport,
            tmp,
        )
        procs.extend([vr, vpd, sr])
        await register(nats.url, engines)
        probe = b'{"model":"%s","messages":[{"role":"user","content":"hi"}],"max_tokens":2}' % MODEL.encode()
        for p in (coord, vr, sr):
            await wait_ok(f"http://127.0.0.1:{p.port}/v1/chat/completions", "POST", probe, within=90)
        probe_pd = probe.replace(MODEL.encode(), MODEL_PD.encode())
        for p in (coord, vpd):
            await wait_ok(f"http://127.0.0.1:{p.port}/v1/chat/completions", "POST", probe_pd, within=90)
        targets.update({"coordinator": coord, "vllm_router": vr, "sglang_router": sr})
        pd_targets = {"coordinator_pd": coord, "vllm_router_pd": vpd}

        json_lua, sse_lua = lua(False, tmp / "json.lua"), lua(True, tmp / "sse.lua")
        pd_lua = lua(False, tmp / "pd.lua", MODEL_PD)
        res = Results()
        url = "http://127.0.0.1:{}/v1/chat/completions"
        for rnd in range(args.rounds):
            for name, p in targets.items():
                port = engines["union"].port if p is None else p.port
                pid = None if p is None else p.proc.pid
                for mode, script in (("json", json_lua), ("sse", sse_lua)):
                    run = wrk(url.format(port), script, 64, args.duration, pid)
                    res.add(f"{name}/{mode}", run)
                    print(
                        f"round {rnd + 1} {name:14s} {mode:4s} c=64 reqs={run.requests:6d} err={run.errors} "
                        f"cpu/req={run.cpu_us:7.1f}us p50={run.p50_ms:.2f}ms",
                        flush=True,
                    )
            for name, p in pd_targets.items():
                run = wrk(url.format(p.port), pd_lua, 64, args.duration, p.proc.pid)
                res.add(f"{name}/json", run)
                print(
                    f"round {rnd + 1} {name:14s} json c=64 reqs={run.requests:6d} err={run.errors} "
                    f"cpu/req={run.cpu_us:7.1f}us p50={run.p50_ms:.2f}ms",
                    flush=True,
                )
            c1 = (("direct", engines["union"].port), ("coordinator", coord.port), ("vllm_router", vr.port))
            for name, port in c1:
                run = wrk(url.format(port), sse_lua, 1, args.duration, None)
                res.add(f"{name}/sse_c1", run)
                print(f"round {rnd + 1} {name:14s} sse  c=1  p50={run.p50_ms:.3f}ms", flush=True)
        return report(res)
    finally:
        for p in reversed(procs):
            p.stop()
        await nats.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def report(res: Results) -> int:
    c, v = res.cpu("coordinator/json"), res.cpu("vllm_router/json")
    cs, vs = res.cpu("coordinator/sse"), res.cpu("vllm_router/sse")
    cp, vp = res.cpu("coordinator_pd/json"), res.cpu("vllm_router_pd/json")
    added = res.p50("coordinator/sse_c1") - res.p50("direct/sse_c1")
    vadded = res.p50("vllm_router/sse_c1") - res.p50("direct/sse_c1")
    s = res.cpu("sglang_router/json")
    print(
        f"ratios vs vllm-router: json {c / v:.2f}x (target <= 1.0), sse {cs / vs:.2f}x (<= 0.8), "
        f"pd {cp / vp:.2f}x (<= 1.0); added p50 c=1 sse {added:.3f} ms (<= 0.2; vllm-router adds "
        f"{vadded:.3f} ms in the same run)"
    )
    print(
        f"BENCH coordinator cpu_us_per_req={c:.1f} vllm_router_cpu_us_per_req={v:.1f} "
        f"stream_cpu_us_per_req={cs:.1f} vllm_router_stream_cpu_us_per_req={vs:.1f} "
        f"pd_cpu_us_per_req={cp:.1f} vllm_router_pd_cpu_us_per_req={vp:.1f} "
        f"stream_added_p50_ms_c1={added:.3f} sglang_router_cpu_us_per_req={s:.1f}"
    )
    return 0


def main(argv: list[str]) -> int:
    """Run the benchmark; the last line printed is `BENCH coordinator ...`."""
    ap = argparse.ArgumentParser(prog="bench coordinator")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds per wrk window (default 10)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    args = ap.parse_args(argv)
    ensure_tools()
    return asyncio.run(bench(args))
