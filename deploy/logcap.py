"""A cap on the size of `motor up`'s log files: none may fill the disk the log store is on.

Every process `motor up` starts (and every engine a node agent starts, and nats-server) writes
its own file under `.motor/logs/` through a descriptor opened for appending, which it keeps.
So a file is cut the way logrotate's `copytruncate` does: once it is past `max_bytes` its
content is copied to `<name>.1` (the older ones shifting to `.2` … up to `keep`) and the file
is truncated to nothing; the writer's next append lands at its new, empty end. Lines written
between the copy and the truncation are lost, a few at most; nothing is held up. A log is
then at most `max_bytes` plus what arrives in one `interval`, `keep` older ones beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

DEFAULT_LOG_MAX = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class LogCap:
    """Cut a log past `max_bytes`, keeping `keep` older copies; look every `interval` seconds."""

    max_bytes: int = DEFAULT_LOG_MAX
    keep: int = 1
    interval: float = 2.0

    def __post_init__(self) -> None:
        if self.max_bytes < 1:
            raise ValueError(f"log cap: at least 1 byte, got {self.max_bytes}")
        if self.keep < 1:
            raise ValueError(f"log cap: keep at least 1 older copy, got {self.keep}")

    def over(self, size: int) -> bool:
        """Whether a log of `size` bytes is to be cut."""
        return size > self.max_bytes


def rotate(path: Path, keep: int) -> None:
    """`path` → `path.1` (`.1` → `.2` … the oldest beyond `keep` dropped), `path` emptied in place."""
    for i in range(keep - 1, 0, -1):
        older = path.with_name(f"{path.name}.{i}")
        if older.exists():
            os.replace(older, path.with_name(f"{path.name}.{i + 1}"))
    shutil.copyfile(path, path.with_name(f"{path.name}.1"))
    os.truncate(path, 0)  # the writer appends (O_APPEND): its next line starts the file again


def cap_once(logs: Path, cap: LogCap) -> list[Path]:
    """Cut every `*.log` under `logs` that is over the cap; return the ones cut."""
    cut: list[Path] = []
    for path in sorted(logs.glob("*.log")):
        try:
            if not cap.over(path.stat().st_size):
                continue
            rotate(path, cap.keep)
        except OSError as exc:  # gone meanwhile, or the disk is full: try again next time
            log.warning("cannot cut log %s: %s", path, exc)
            continue
        cut.append(path)
    return cut


async def cap_logs(logs: Path, cap: LogCap) -> None:
    """Keep every log under `logs` under the cap until cancelled."""
    while True:
        with contextlib.suppress(OSError):
            for path in await asyncio.to_thread(cap_once, logs, cap):
                log.info("log %s passed %d bytes: its older part is %s.1", path, cap.max_bytes, path.name)
        await asyncio.sleep(cap.interval)  # nothing to await but time: the writers are other processes


def start_log_cap(logs: Path, max_bytes: int | None) -> asyncio.Task[None] | None:
    """Cap the logs under `logs` in the background (None: no cap, no task)."""
    if max_bytes is None:
        return None
    return asyncio.get_running_loop().create_task(cap_logs(logs, LogCap(max_bytes)), name="log-cap")


async def stop_log_cap(task: asyncio.Task[None] | None) -> None:
    """Stop what `start_log_cap` started."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
