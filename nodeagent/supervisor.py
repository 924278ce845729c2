"""Engine processes: spawn in their own process group, await their exit, stop them as a group.

A process this agent spawned is awaited directly (its exit code is known at once). A process
adopted after an agent restart is not our child: its exit is awaited through a pidfd (no
polling), and its exit code is unknown. Identity of an adopted pid is checked against the
start time recorded at spawn, so a recycled pid is never mistaken for our engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nodeagent.errors import CommandRefusal

log = logging.getLogger(__name__)


def proc_start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return int(rest[19])
    except (IndexError, ValueError):
        return None


def group_alive(pgid: int) -> bool:
    """Whether any process of the group still exists (zombies included)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def port_free(host: str, port: int) -> bool:
    """Whether `port` can be bound on `host` right now (what the engine is about to do)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


@dataclass(frozen=True, slots=True)
class Exit:
    """How an engine process ended: its exit code (None when unknown) and a readable reason."""

    code: int | None
    reason: str


def describe_exit(code: int | None) -> str:
    if code is None:
        return "process exited (adopted after an agent restart: exit code unknown)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"process killed by {name}"
    return f"process exited with code {code}"


class EngineProcess:
    """One engine process (the main process of its own process group)."""

    def __init__(self, pid: int, start_time: int | None, proc: asyncio.subprocess.Process | None) -> None:
        self.pid = pid
        self.pgid = pid  # start_new_session: the engine leads its own group
        self.start_time = start_time
        self._proc = proc
        self._exit: asyncio.Future[Exit] = asyncio.get_running_loop().create_future()
        self._watch = asyncio.create_task(self._watch_exit(), name=f"engine-exit-{pid}")

    @classmethod
    async def spawn(cls, argv: tuple[str, ...], env: Mapping[str, str], log_path: Path) -> EngineProcess:
        """Start `argv` in a new session, stdout and stderr appended to `log_path`."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as fh:
            fh.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} starting: {' '.join(argv)}\n".encode())
            fh.flush()
            try:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=fh,
                    stderr=asyncio.subprocess.STDOUT,
                    env=dict(env),
                    start_new_session=True,
                )
            except FileNotFoundError:
                raise CommandRefusal("spawn_failed", f"engine program {argv[0]!r} not found") from None
            except PermissionError:
                raise CommandRefusal(
                    "spawn_failed", f"engine program {argv[0]!r} is not executable"
                ) from None
            except OSError as exc:
                raise CommandRefusal(
                    "spawn_failed", f"cannot start {argv[0]!r}: {exc.strerror or exc}"
                ) from None
        return cls(proc.pid, proc_start_time(proc.pid), proc)

    @classmethod
    def adopt(cls, pid: int, start_time: int | None) -> EngineProcess | None:
        """Take over a still-running engine of an earlier agent; None if it is gone or not ours."""
        current = proc_start_time(pid)
        if current is None or (start_time is not None and current != start_time):
            return None
        return cls(pid, current, None)

    @property
    def adopted(self) -> bool:
        return self._proc is None

    @property
    def exited(self) -> bool:
        return self._exit.done()

    async def wait(self) -> Exit:
        """Wait for the main process to end."""
        return await asyncio.shield(self._exit)

    async def _watch_exit(self) -> None:
        try:
            if self._proc is not None:
                code = await self._proc.wait()
            else:
                await _wait_pidfd(self.pid)
                code = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("watching engine pid %d failed: %s", self.pid, exc)
            code = None
        if not self._exit.done():
            self._exit.set_result(Exit(code, describe_exit(code)))

    async def stop(self, grace: float) -> Exit:
        """SIGTERM the main process, then its group; SIGKILL the group after `grace` seconds.

        The main process alone first: vLLM's API server then shuts its engine core and workers
        down in order, where a group-wide SIGTERM kills them under it (EngineDeadError, force
        kills). The group gets SIGTERM once the main process is gone, for whatever is left.
        """
        if not self.exited:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(self.wait(), grace)
        except TimeoutError:
            log.warning("engine pid %d ignored SIGTERM for %.1fs; killing its group", self.pid, grace)
            signal_group(self.pgid, signal.SIGKILL)
            await self.wait()
        # Workers the engine left behind die with the group.
        deadline = time.monotonic() + grace
        while group_alive(self.pgid) and time.monotonic() < deadline:
            signal_group(self.pgid, signal.SIGTERM)
            await asyncio.sleep(0.05)
        if group_alive(self.pgid):
            signal_group(self.pgid, signal.SIGKILL)
        return await self.wait()

    async def close(self) -> None:
        """Stop watching (the process itself is left alone)."""
        self._watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._watch


async def _wait_pidfd(pid: int) -> None:
    """Return when `pid` exits, via a pidfd becoming readable (Linux >= 5.3)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, on_exit)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)
