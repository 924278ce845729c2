"""Processes a bench starts: spawning with a log, stopping, polling, and the open-files limit."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def raise_fd_limit(needed: int) -> int:
    """Raise the soft open-files limit towards `needed` (children inherit it); return it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        soft = want
    if soft != resource.RLIM_INFINITY and soft < needed:
        raise RuntimeError(f"needs {needed} open files; the hard limit is {hard} (ulimit -Hn)")
    return int(soft)


@dataclass
class Proc:
    """A process the bench started, and its log."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def check(self) -> None:
        """Raise with the tail of its log if it exited."""
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")

    def stop(self, within: float) -> None:
        """SIGTERM, then SIGKILL after `within` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(within)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(name: str, argv: list[str], tmp: Path, *, port: int = 0, piped: bool = False) -> Proc:
    """Start `argv` in its own session, stderr (and stdout unless `piped`) to `<tmp>/<name>.log`."""
    log = tmp / f"{name}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdin=subprocess.PIPE if piped else subprocess.DEVNULL,
            stdout=subprocess.PIPE if piped else fh, stderr=fh, start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    return Proc(name, proc, log, port)


def readline(p: Proc) -> str:
    """One line of a piped process's stdout (blocking: run it in an executor)."""
    assert p.proc.stdout is not None
    return p.proc.stdout.readline().decode(errors="replace").strip()


async def until(what: str, check: Callable[[], Awaitable[bool]], procs: list[Proc], within: float) -> None:
    """Poll `check` until true; raise if a process exits or `within` seconds pass."""
    deadline = time.monotonic() + within
    while not await check():
        for p in procs:
            p.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {within:g} s")
        await asyncio.sleep(0.2)  # polling other processes
