"""The embedded nats-server's store: sized to its disk, and restarted when a write error wedges it.

`plan` fits MOTOR's `max_bytes` and the server's `max_file_store` into the disk under the
store (`core.storelimits`), so a write past them is refused with an error naming the limit
before the disk itself is full. Something else can still fill that disk (the logs, another
program): nats-server 2.15 then fails a write with ENOSPC, answers no publish from then on
(clients time out) and keeps the stream in that write error after space returns, until it is
restarted. `StoreWatch` is the supervisor's probe of it: the server's own health check names
the write error; once the disk has room again the server is killed (every acknowledged
write was fsynced: `sync_interval: always`) and the supervisor starts it on the same store,
which takes writes again. While the disk is still full a restart would only fail again, so it
waits, and says so once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
from collections.abc import Callable, Sequence
from pathlib import Path

from core.config import ClusterConfig
from core.storelimits import MiB, StorePlan, plan_store
from deploy.liveness import LivenessRule
from deploy.supervise import Notice, Watch
from streams.server import EmbeddedNats

log = logging.getLogger(__name__)

# A write error is no freeze: a probe every second, two in a row restart it (an answer that
# does not come, a frozen or starting server, counts as healthy: that is NATS away, ridden out).
NATS_LIVENESS = LivenessRule(interval=1.0, timeout=2.0, misses=2)
MIN_FREE = 1 * MiB  # room a restarted server needs to write again


def free_bytes(path: Path) -> int:
    """Free bytes on the disk holding `path` (its nearest existing ancestor)."""
    p = path.resolve()
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def used_bytes(path: Path) -> int:
    """Bytes the files under `path` hold (0 when it does not exist)."""
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, f)).st_size
    return total


def plan(store_dir: Path, max_bytes: int | None) -> StorePlan:
    """MOTOR's `max_bytes` and the server's store cap for a store at `store_dir`; ConfigError
    (naming the sizes) when the disk cannot hold them."""
    return plan_store(max_bytes, free=free_bytes(store_dir), used=used_bytes(store_dir), where=str(store_dir))


def fit_store(cfg: ClusterConfig, stores: Sequence[Path]) -> tuple[ClusterConfig, int]:
    """`cfg` with `nats.max_bytes` fit to the disks under `stores` (every member's store), and
    the servers' `max_file_store`; `motor up` runs every process on that config."""
    sized = min((plan(p, cfg.nats.max_bytes) for p in stores), key=lambda s: s.max_file_store)
    nats = cfg.nats.model_copy(update={"max_bytes": sized.max_bytes})
    return cfg.model_copy(update={"nats": nats}), sized.max_file_store


class StoreWatch:
    """The supervisor's probe, kill and reason for one embedded server (`deploy.supervise.Watch`)."""

    def __init__(
        self, server: EmbeddedNats, name: str, notify: Callable[[Notice], None] | None = None
    ) -> None:
        self.server = server
        self.name = name
        self.notify = notify  # the supervisor's, so `motor up` shows the full disk as it happens
        self.error = ""
        self._waiting_for_room = False

    async def probe(self) -> bool:
        """False when the server reports a store write error and its disk has room again."""
        err = await self.server.write_error(NATS_LIVENESS.timeout)
        if err is None:
            self._waiting_for_room = False
            return True
        self.error = err
        free = free_bytes(self.server.store_dir)
        if free < MIN_FREE:
            if not self._waiting_for_room:
                said = (
                    f"cannot write its store ({err}) and the disk under {self.server.store_dir} has "
                    f"{free} bytes free: publishes fail meanwhile (Motor's processes keep their events "
                    "and send them again); free disk space there and it is restarted"
                )
                if self.notify is not None:
                    self.notify(Notice(self.name, "stuck", None, 0.0, 0, detail=said))
                else:
                    log.error("%s %s", self.name, said)
            self._waiting_for_room = True
            return True  # a restart now would hit the same full disk
        return False

    def kill(self) -> bool:
        """SIGKILL the server (False when it is not running); the supervisor starts it again."""
        pid = self.server.pid
        if pid is None:
            return False
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

    def wedged(self) -> str:
        """What the server reported."""
        return f"its store cannot be written: {self.error}"


def watch(server: EmbeddedNats, name: str, notify: Callable[[Notice], None] | None = None) -> Watch:
    """The supervisor's watch of an embedded server: restarted when it exits, or when a store
    write error wedges it and its disk has room again (`notify`: the supervisor's)."""
    store = StoreWatch(server, name, notify)
    return Watch(
        name,
        lambda: server.pid,
        server.wait,
        server.start,
        probe=store.probe,
        kill=store.kill,
        liveness=NATS_LIVENESS,
        wedged=store.wedged,
    )
