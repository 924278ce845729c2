"""Liveness probing for `motor up`: a replica that stops answering is taken out of the port.

Coordinator replicas share one port (`SO_REUSEPORT`); the kernel hands each new connection
to one of the listening sockets and knows nothing of whether the process behind it answers.
A SIGSTOPped replica, or one whose event loop is wedged, keeps its socket in the group and
swallows its share of connections; the supervisor (`deploy.supervise`) sees only exits. So
each replica also listens on a private Unix socket of its own (`motor coordinator
--probe-socket`), served by the same event loop and the same management app as its port, and
the supervisor asks its `/liveness` there: a probe on the shared port would land on a random
replica. A path in the filesystem, not a TCP port: nothing to allocate, and it reaches a
replica in another network namespace too (tests/multihost).

`LivenessRule` is the pure decision (misses in a row, from the first answer on, until a kill);
`probe_unix` is one probe. Killing is the only way out of the port for a stopped process (it
cannot close its own socket): the kernel then drops the socket from the group, resets the
connections waiting in its accept queue and the ones it had accepted, clients retry on the
other replicas, and the supervisor starts a fresh replica, which joins once caught up.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import tempfile
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

LIVENESS_PATH = "/liveness"
MAX_UNIX_PATH = 107  # sun_path holds 108 bytes, one of them the terminating NUL


class Verdict(Enum):
    """What one probe's result means for the process."""

    WAITING = "waiting"  # it has never answered: starting, not in the port yet
    ALIVE = "alive"
    MISSED = "missed"  # no answer, but fewer than `misses` in a row
    KILL = "kill"  # `misses` in a row: take it out of the port


@dataclass(frozen=True, slots=True)
class Probing:
    """One process incarnation as the prober has seen it so far."""

    answered: bool = False  # armed: it answered once, so silence now means frozen or wedged
    misses: int = 0  # unanswered probes in a row since the last answer


@dataclass(frozen=True, slots=True)
class LivenessRule:
    """Probe every `interval` s, give each probe `timeout` s; `misses` in a row kill.

    A frozen replica is killed `misses` × max(`interval`, `timeout`) after it froze at most,
    plus the one probe in flight when it froze (2 s by default). A replica is judged only
    once it has answered: before that it is starting and has not joined the port (it listens
    on its probe socket before its shared one), so a slow start is never killed for it.
    """

    # 1.5-1.75 s from a freeze to the kill (1.5 s of silence in a row): a request the frozen
    # replica took is reset and retried by its client within 5 s of its start even when it
    # had run a second already, while a busy but healthy replica, which answers /liveness
    # from memory in milliseconds, is not killed for a pause.
    interval: float = 0.25
    timeout: float = 0.5
    misses: int = 3

    def __post_init__(self) -> None:
        for name, value in (("interval", self.interval), ("timeout", self.timeout)):
            if not (math.isfinite(value) and 0.05 <= value <= 60):
                raise ValueError(f"liveness {name}: 0.05 to 60 seconds, got {value}")
        if not 1 <= self.misses <= 100:
            raise ValueError(f"liveness misses: 1 to 100 probes in a row, got {self.misses}")

    @property
    def kill_within(self) -> float:
        """The longest a frozen, already answering process goes on before it is killed."""
        return (self.misses + 1) * max(self.interval, self.timeout)

    def step(self, seen: Probing, answered: bool) -> tuple[Probing, Verdict]:
        """The next state and verdict after one probe that `answered` (or not)."""
        if answered:
            return Probing(answered=True), Verdict.ALIVE
        if not seen.answered:
            return seen, Verdict.WAITING
        misses = seen.misses + 1
        verdict = Verdict.KILL if misses >= self.misses else Verdict.MISSED
        return Probing(answered=True, misses=misses), verdict


async def probe_unix(path: str, within: float) -> bool:
    """Whether the server on the Unix socket `path` answers `GET /liveness` 200 `within` seconds.

    A refused or missing socket is no answer: either the process is gone (its exit is the
    supervisor's business) or it has not started listening yet.
    """
    writer: asyncio.StreamWriter | None = None
    try:
        async with asyncio.timeout(within):
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(
                f"GET {LIVENESS_PATH} HTTP/1.1\r\nHost: liveness\r\nConnection: close\r\n\r\n".encode()
            )
            await writer.drain()
            status = await reader.readline()
    except (OSError, TimeoutError):
        return False
    finally:
        if writer is not None:
            # Abort, not close: a graceful close would wait on a peer that may not read.
            writer.transport.abort()
    return status.startswith(b"HTTP/1.1 200 ")


def probe_dir(root: Path, session: str, names: list[str]) -> Path:
    """Where the probe sockets of the processes `names` live: `<root>/run`, or a directory of
    this session's under the temp dir when that would make a path too long for a socket."""
    local = root / "run"
    longest = max((len(n) for n in names), default=0) + len("/.sock")
    if len(os.fsencode(local)) + longest <= MAX_UNIX_PATH:
        return local
    return Path(tempfile.gettempdir()) / f"motor-{session}"


def remove_probe_sockets(run_dir: Path, root: Path, names: list[str]) -> None:
    """What a killed replica could not remove itself; the temp dir too, if one was made."""
    for name in names:
        with contextlib.suppress(OSError):
            (run_dir / f"{name}.sock").unlink()
    if run_dir.parent != root:
        with contextlib.suppress(OSError):
            run_dir.rmdir()
