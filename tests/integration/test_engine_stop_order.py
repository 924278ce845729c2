"""Stopping an engine: its main process gets SIGTERM first, the rest of its group only after.

vLLM's API server shuts its engine core and workers down itself on SIGTERM; a group-wide
SIGTERM at the same moment kills them under it. Pinned with a real two-process group: a main
process and a child in its group, each recording when it saw SIGTERM or exited.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from nodeagent.supervisor import EngineProcess

# The main process starts a child in its own process group, waits for SIGTERM, then lingers a
# moment (as vLLM does while it stops its children) and records its exit time. The child
# records when SIGTERM reached it.
MAIN = r"""
import os, signal, subprocess, sys, time
out = sys.argv[1]
child = subprocess.Popen([sys.executable, "-c", sys.argv[2], out])
def on_term(*_):
    time.sleep(0.3)
    with open(out, "a") as f:
        f.write(f"main-exit {time.monotonic()}\n")
    os._exit(0)
signal.signal(signal.SIGTERM, on_term)
with open(out, "a") as f:
    f.write("ready\n")
while True:
    signal.pause()  # until SIGTERM
"""
CHILD = r"""
import signal, sys, time
out = sys.argv[1]
def on_term(*_):
    with open(out, "a") as f:
        f.write(f"child-term {time.monotonic()}\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
while True:
    signal.pause()  # until SIGTERM
"""


async def test_group_gets_sigterm_only_after_the_main_process_exited(tmp_path: Path) -> None:
    out = tmp_path / "events.txt"
    proc = await EngineProcess.spawn(
        (sys.executable, "-c", MAIN, str(out), CHILD), {}, tmp_path / "engine.log"
    )
    try:
        # Nothing to await from a foreign process but its file: poll with a deadline.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while not (out.exists() and "ready" in out.read_text()):
            assert loop.time() < deadline, (tmp_path / "engine.log").read_text()
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # let the child install its handler
        ex = await proc.stop(grace=10)
    finally:
        await proc.close()
    assert ex.code == 0
    times = dict(line.split() for line in out.read_text().splitlines() if line != "ready")
    assert float(times["child-term"]) >= float(times["main-exit"]), times
