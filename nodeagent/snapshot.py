"""Container snapshot (vLLM only): metadata and observation; the engine suspends and resumes itself.

The agent never calls the engine's `/suspend`, `/device_unlock` or `/resume`. It:
1. writes `snapshot_metadata.json` in `snapshot.metadata_dir` on a start command
   (`model_save_path`, `model_load_path`, `data_parallel_master_ip` — a value already in the
   file wins, as after a restore — `job_name`, `pod_ip`) -> phase `metadata_prepared`;
2. sees every endpoint healthy: the engine image suspends itself there, the node reached its
   steady point -> `suspended` (heartbeats flagged `snapshot_pending`, `/readiness` 200 so
   the host side may checkpoint);
3. sees the host's checkpoint marker (the file `<metadata_dir>/<checkpoint_marker>`, or
   `"checkpoint": "done"` in the metadata) -> `checkpoint_done`;
4. sees the engines healthy again after it -> `restored` (pending cleared).
An agent starting in a restored container (the marker is present and the metadata's
`pod_ip` is not ours, or `MOTOR_SNAPSHOT_RESTORED=1`) takes its job name from the metadata
and re-registers with `restored=True`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from core.config import SnapshotConfig
from core.events import SnapshotPhase, StartCommandData

log = logging.getLogger(__name__)

METADATA_FILE = "snapshot_metadata.json"
RESTORED_ENV = "MOTOR_SNAPSHOT_RESTORED"
PENDING = frozenset({SnapshotPhase.SUSPENDED, SnapshotPhase.CHECKPOINT_DONE})

Emit = Callable[[SnapshotPhase, dict[str, str]], None]


class Snapshot:
    def __init__(self, cfg: SnapshotConfig, pod_ip: str, emit: Emit, all_ready: Callable[[], bool]) -> None:
        self.cfg = cfg
        self.pod_ip = pod_ip
        self.emit = emit
        self.all_ready = all_ready
        self.dir = Path(cfg.metadata_dir)
        self.phase: SnapshotPhase | None = None

    @property
    def metadata_path(self) -> Path:
        return self.dir / METADATA_FILE

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
        tmp = self.metadata_path.with_name(METADATA_FILE + ".tmp")
        tmp.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
        os.replace(tmp, self.metadata_path)

    def checkpoint_done(self) -> bool:
        if (self.dir / self.cfg.checkpoint_marker).exists():
            return True
        return str(self.read().get("checkpoint", "")).lower() == "done"

    def restored_job(self) -> str | None:
        """At start-up: the job name to take over when this container was restored, else None."""
        meta = self.read()
        if not meta or not self.checkpoint_done():
            return None
        moved = meta.get("pod_ip") not in (None, self.pod_ip)
        if not moved and os.environ.get(RESTORED_ENV) != "1":
            return None
        job = meta.get("job_name")
        return str(job) if job else None

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

    def _to(self, phase: SnapshotPhase, metadata: dict[str, str]) -> None:
        if phase == self.phase:
            return
        log.info("snapshot: %s -> %s", self.phase and self.phase.value, phase.value)
        self.phase = phase
        self.emit(phase, metadata)
