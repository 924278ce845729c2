"""Finding and stopping what a `motor up` session started, our children or not.

Every child of the session carries `MOTOR_UP_SESSION=<id>` in its environment, and so do the
engines node agents start in their own process groups: `/proc` finds them all.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from deploy.supervise import wait_popen


def session_pids(session: str) -> Iterator[int]:
    """Every process but this one whose environment carries the session's marker."""
    marker = f"MOTOR_UP_SESSION={session}".encode()
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0"):
            yield int(entry.name)


async def wait_for_exit(proc: subprocess.Popen[bytes], grace: float) -> None:
    """Wait up to `grace` seconds for a child to exit."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(grace):
            await wait_popen(proc)


async def stop_strays(pids: list[int]) -> None:
    """SIGTERM processes that are not our children, SIGKILL what is left after 5 s."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    # Not our children: nothing to await but their disappearance from /proc.
    while time.monotonic() < deadline and any(_alive(p) for p in pids):  # noqa: ASYNC110
        await asyncio.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours counts as gone.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"
