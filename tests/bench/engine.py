"""`just bench engine`: the builtin engine's floor — req/s and CPU µs per request in --fast mode.

Starts one `motor engine builtin --fast` process, drives it at concurrency 64 with wrk (a
non-streamed chat completion of 16 tokens, then the same streamed as SSE: 16 content chunks),
and reads the engine's CPU time from /proc/<pid>/stat around each run. wrk comes from Debian
(`apt-get install wrk`, done here when it is missing and we are root); without it a bounded
asyncio load generator stands in. Last line:
`BENCH engine json_rps=… json_cpu_us_per_req=… sse_rps=… sse_cpu_us_per_req=…`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from tests.integration.builtin_proc import BuiltinEngineProc

CLK_TCK = os.sysconf("SC_CLK_TCK")
BODY = {
    "model": "motor-sim",
    "messages": [{"role": "user", "content": "Summarize the benefits of prefill/decode disaggregation."}],
    "max_tokens": 16,
    "temperature": 0,
}


def cpu_seconds(pid: int) -> float:
    """user + system CPU time of a process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def ensure_wrk() -> str | None:
    """The wrk binary, installing Debian's package if we can; None if it cannot be had."""
    found = shutil.which("wrk")
    if found or os.geteuid() != 0 or not shutil.which("apt-get"):
        return found
    print("installing wrk with apt-get ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "wrk"]):
        if subprocess.run(cmd, env=env, capture_output=True, timeout=600).returncode != 0:
            return None
    return shutil.which("wrk")


def run_wrk(wrk: str, url: str, body: bytes, conns: int, seconds: float) -> tuple[int, float]:
    """(requests completed, seconds) of one wrk run; fails on non-2xx answers."""
    script = (
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = {lua_string(body)}\n"
    )
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(script)
    try:
        out = subprocess.run(
            [wrk, "-t2", f"-c{conns}", f"-d{max(1, round(seconds))}s", "-s", f.name, url],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
        ).stdout
    finally:
        os.unlink(f.name)
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk saw errors:\n{out}")
    m = re.search(r"(\d+) requests in ([\d.]+)(m?s)", out)
    if m is None:
        raise RuntimeError(f"cannot parse wrk output:\n{out}")
    took = float(m.group(2)) / (1000 if m.group(3) == "ms" else 1)
    return int(m.group(1)), took


def lua_string(data: bytes) -> str:
    return '"' + data.decode().replace("\\", "\\\\").replace('"', '\\"') + '"'


async def _asyncio_load(url: str, body: bytes, conns: int, seconds: float) -> tuple[int, float]:
    import aiohttp

    done = 0
    stop_at = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=conns)
    async with aiohttp.ClientSession(connector=connector) as s:

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < stop_at:
                async with s.post(url, data=body, headers={"Content-Type": "application/json"}) as r:
                    await r.read()
                    if r.status != 200:
                        raise RuntimeError(f"engine answered {r.status}")
                done += 1

        t0 = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(conns)))
        return done, time.monotonic() - t0


def measure(
    eng: BuiltinEngineProc, wrk: str | None, body: bytes, conns: int, seconds: float
) -> tuple[float, float]:
    """(req/s, engine CPU µs per request) for one body."""
    assert eng.proc is not None
    url = eng.url + "/v1/chat/completions"
    before = cpu_seconds(eng.proc.pid)
    if wrk is not None:
        n, took = run_wrk(wrk, url, body, conns, seconds)
    else:
        n, took = asyncio.run(_asyncio_load(url, body, conns, seconds))
    cpu = cpu_seconds(eng.proc.pid) - before
    if n == 0:
        raise RuntimeError("no request completed")
    return n / took, cpu * 1e6 / n


def main(argv: list[str]) -> int:
    """Run the benchmark; prints the BENCH line last."""
    ap = argparse.ArgumentParser(prog="bench engine")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--no-wrk", action="store_true", help="use the asyncio load generator")
    args = ap.parse_args(argv)
    wrk = None if args.no_wrk else ensure_wrk()
    print(f"load generator: {wrk or 'asyncio (wrk unavailable)'}", flush=True)
    with (
        tempfile.TemporaryDirectory() as tmp,
        BuiltinEngineProc(Path(tmp), "--fast", "--log-level", "WARNING") as eng,
    ):
        results = {}
        for name, body in (("json", BODY), ("sse", {**BODY, "stream": True})):
            raw = orjson.dumps(body)
            measure(eng, wrk, raw, args.concurrency, 1.0)  # warm-up
            rps, cpu_us = measure(eng, wrk, raw, args.concurrency, args.seconds)
            print(f"{name}: {rps:,.0f} req/s, {cpu_us:.1f} µs engine CPU per request", flush=True)
            results[name] = (rps, cpu_us)
    (jr, jc), (sr, sc) = results["json"], results["sse"]
    print(
        f"BENCH engine json_rps={jr:.0f} json_cpu_us_per_req={jc:.1f} sse_rps={sr:.0f} sse_cpu_us_per_req={sc:.1f} "
        f"concurrency={args.concurrency} tool={'wrk' if wrk else 'asyncio'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
