"""Container snapshot (vLLM only): metadata and observation; the engine suspends and resumes itself.

The agent never calls the engine's `/suspend`, `/device_unlock` or `/resume`. It:
1. writes the metadata file (`snapshot.metadata_path`, default the seed's
   `/snapshot/snapshot_metadata.json`) on a start command (`model_save_path`,
   `model_load_path`, `job_name`, `pod_ip`; `data_parallel_master_ip` and `namespace` — a
   value already in the file wins, as after a restore) -> phase `metadata_prepared`;
2. sees every endpoint healthy: the engine image suspends itself there, the node reached its
   steady point -> `suspended` (heartbeats flagged `snapshot_pending`, `/readiness` 200 so
   the host side may checkpoint);
3. sees the host's checkpoint marker (the file `<checkpoint_marker>` beside the metadata, or
   `"checkpoint": "done"` in the metadata) -> `checkpoint_done`;
4. sees the engines healthy again after it -> `restored` (pending cleared).
An agent starting in a restored container (the marker is present and the metadata's
`pod_ip` is not ours, or `MOTOR_SNAPSHOT_RESTORED=1`) takes its job name from the metadata
and re-registers with `restored=True`; the metadata's `namespace` re-resolves cluster DNS
names in its NATS URLs (`nats.<old-ns>.svc.cluster.local` -> `nats.<namespace>.svc…`), the
seed's "refresh the Controller DNS".
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import orjson

from core.config import SnapshotConfig
from core.events import SnapshotPhase, StartCommandData

log = logging.getLogger(__name__)

POLL_INTERVAL = 0.5

RESTORED_ENV = "MOTOR_SNAPSHOT_RESTORED"
PENDING = frozenset({SnapshotPhase.SUSPENDED, SnapshotPhase.CHECKPOINT_DONE})

Emit = Callable[[SnapshotPhase, dict[str, str]], None]


class Snapshot:
    def __init__(self, cfg: SnapshotConfig, pod_ip: str, emit: Emit, all_ready: Callable[[], bool]) -> None:
        self.cfg = cfg
        self.pod_ip = pod_ip
        self.emit = emit
        self.all_ready = all_ready
        self.path = Path(cfg.metadata_file())
        self.dir = self.path.parent
        self.phase: SnapshotPhase | None = None

    @property
    def metadata_path(self) -> Path:
        return self.path

    @property
    def pending(self) -> bool:
        return self.phase in PENDING

    @property
    def steady(self) -> bool:
        """The node reached its steady point: the host may take the checkpoint now."""
        return self.phase == SnapshotPhase.SUSPENDED

    def read(self) -> dict[str, Any]:
        try:
            raw = orjson.loads(self.metadata_path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, orjson.JSONDecodeError) as exc:
            log.warning("snapshot metadata %s unreadable: %s", self.metadata_path, exc)
            return {}
        return raw if isinstance(raw, dict) else {}

    def _write(self, data: dict[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.metadata_path.with_name(self.metadata_path.name + ".tmp")
        tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
        os.replace(tmp, self.metadata_path)

    def checkpoint_done(self) -> bool:
        if (self.dir / self.cfg.checkpoint_marker).exists():
            return True
        return str(self.read().get("checkpoint", "")).lower() == "done"

    def restored_meta(self) -> dict[str, Any] | None:
        """At start-up: the metadata when this container was restored from a snapshot, else None."""
        meta = self.read()
        if not meta or not self.checkpoint_done():
            return None
        moved = meta.get("pod_ip") not in (None, self.pod_ip)
        if not moved and os.environ.get(RESTORED_ENV) != "1":
            return None
        return meta

    def restored_job(self) -> str | None:
        """At start-up: the job name to take over when this container was restored, else None."""
        meta = self.restored_meta()
        job = meta.get("job_name") if meta else None
        return str(job) if job else None

    def restored_namespace(self) -> str | None:
        """At start-up: the namespace a restored container's metadata names, else None."""
        meta = self.restored_meta()
        ns = meta.get("namespace") if meta else None
        return str(ns) if ns else None

    def prepare(self, cmd: StartCommandData) -> dict[str, str]:
        """Write the metadata for a start command and report `metadata_prepared`."""
        meta = self.read()
        fields = {
            "model_save_path": self.cfg.model_save_path,
            "model_load_path": self.cfg.model_load_path,
            "job_name": cmd.job_name,
            "pod_ip": self.pod_ip,
        }
        meta.update({k: v for k, v in fields.items() if v is not None})
        meta.setdefault("data_parallel_master_ip", cmd.master_dp_ip)
        if self.cfg.namespace:
            meta.setdefault("namespace", self.cfg.namespace)
        self._write(meta)
        shown = {k: str(v) for k, v in meta.items() if k != "checkpoint"}
        if self.phase != SnapshotPhase.RESTORED:
            self._to(SnapshotPhase.METADATA_PREPARED, shown)
        return shown

    def mark_restored(self) -> None:
        self._to(SnapshotPhase.RESTORED, {"pod_ip": self.pod_ip})

    def step(self) -> None:
        """Advance on what can be observed now (called periodically)."""
        if self.phase == SnapshotPhase.METADATA_PREPARED and self.all_ready():
            self._to(SnapshotPhase.SUSPENDED, {})
        elif self.phase == SnapshotPhase.SUSPENDED and self.checkpoint_done():
            self._to(SnapshotPhase.CHECKPOINT_DONE, {})
        elif self.phase == SnapshotPhase.CHECKPOINT_DONE and self.all_ready():
            self._to(SnapshotPhase.RESTORED, {})

    async def run(self, interval: float = POLL_INTERVAL) -> None:
        """Step every `interval` seconds until cancelled (the checkpoint marker is a file)."""
        while True:
            self.step()
            await asyncio.sleep(interval)

    def _to(self, phase: SnapshotPhase, metadata: dict[str, str]) -> None:
        if phase == self.phase:
            return
        log.info("snapshot: %s -> %s", self.phase and self.phase.value, phase.value)
        self.phase = phase
        self.emit(phase, metadata)


def with_namespace(urls: list[str], namespace: str) -> list[str]:
    """URLs whose host is a cluster DNS name (`svc.<ns>.svc[.cluster.local]`) moved to `namespace`."""
    out = []
    for url in urls:
        parts = urlsplit(url)
        host = parts.hostname or ""
        labels = host.split(".")
        if len(labels) >= 3 and labels[2] == "svc" and labels[1] != namespace:
            labels[1] = namespace
            netloc = parts.netloc.replace(host, ".".join(labels), 1)
            url = urlunsplit(parts._replace(netloc=netloc))
        out.append(url)
    return out
