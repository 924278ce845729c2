"""Running `motor up` as a user does, and finding its processes: shared by the e2e tests of it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import openai


def pids_with(word: bytes) -> list[int]:
    """Processes whose command line holds `word` (this test's config path)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if word in argv:
            out.append(int(entry.name))
    return out


def pid_of(config: Path, name: str) -> int:
    key = str(config).encode()
    for pid in pids_with(key):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        if name.encode() in argv:
            return pid
    seen = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[-160:] for pid in pids_with(key)}
    raise AssertionError(f"no {name} process among {seen}")


async def new_pid_of(config: Path, name: str, old: int, within: float = 10.0) -> int:
    """The pid of `name` once /proc shows a process other than `old` under it.

    A process just spawned can still show its parent's command line for a moment.
    """
    deadline = time.monotonic() + within
    while True:
        try:
            pid = pid_of(config, name)
        except AssertionError:
            pid = old
        if pid != old or time.monotonic() > deadline:
            return pid
        await asyncio.sleep(0.1)


class Lines:
    """The lines `motor up` printed so far; `wait` for one that holds a text."""

    def __init__(self, stream: asyncio.StreamReader) -> None:
        self.stream = stream
        self.seen: list[str] = []

    async def wait(self, text: str, within: float) -> str:
        for line in self.seen:
            if text in line:
                return line
        async with asyncio.timeout(within):
            while True:
                raw = await self.stream.readline()
                assert raw, f"motor up ended before printing {text!r}:\n" + "\n".join(self.seen)
                line = raw.decode(errors="replace").rstrip()
                self.seen.append(line)
                if text in line:
                    return line


async def ask(base: str) -> str:
    client = openai.AsyncOpenAI(base_url=base, api_key="none", max_retries=0, timeout=30)
    try:
        r = await client.chat.completions.create(
            model="motor-sim", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0
        )
        return r.choices[0].message.content or ""
    finally:
        await client.close()
