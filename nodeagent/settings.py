"""The node agent's own settings (from flags, env fallbacks and the cluster config)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from core.config import ClusterConfig, EngineSection
from core.events import Role
from nodeagent.errors import StartupError

CUDA_ENV = "CUDA_VISIBLE_DEVICES"
ASCEND_ENV = "ASCEND_RT_VISIBLE_DEVICES"


@dataclass(frozen=True, slots=True)
class AgentSettings:
    """Who this agent is and where it listens, logs and keeps its run state."""

    config: ClusterConfig
    node_id: str
    role: Role
    ip: str  # the pod IP: engines bind and register on it
    port: int = 8200  # the agent's HTTP port (0: any free port)
    host: str | None = None  # HTTP bind address; default: ip
    engine_port_base: int = 9000
    devices: tuple[str, ...] = ()
    job_name: str = "motor"
    log_dir: Path = Path(".motor/logs")
    run_dir: Path | None = None  # default: <log_dir>/../run
    nats_urls: list[str] | None = None
    device_env: str = CUDA_ENV
    keep_engines: bool = False  # on a graceful exit, leave the engines running
    resync_interval: float = 5.0
    fault_poll_interval: float | None = None  # overrides the section's fault_tolerance.poll_interval
    python: str = field(default_factory=lambda: sys.executable)

    @property
    def section(self) -> EngineSection:
        """The engine section of this agent's role."""
        sec = self.config.section(self.role)
        if sec is None:
            raise StartupError(
                f"the config has no {self.role.value!r} engine section for --role {self.role.value}"
            )
        return sec

    @property
    def fault_reporter_on(self) -> bool:
        """Poll `/fault_tolerance/status`: the cluster-wide switch, else the section's rule."""
        return self.config.nodeagent.fault_reporter or self.section.fault_reporter_on()

    @property
    def poll_interval(self) -> float:
        """Seconds between fault-tolerance polls (seed 002 `poll_interval_sec`)."""
        if self.fault_poll_interval is not None:
            return self.fault_poll_interval
        return self.section.fault_tolerance.poll_interval

    @property
    def bind_host(self) -> str:
        return self.host or self.ip

    @property
    def state_dir(self) -> Path:
        return self.run_dir if self.run_dir is not None else self.log_dir.parent / "run"

    @property
    def state_file(self) -> Path:
        return self.state_dir / f"nodeagent-{self.node_id}.json"

    @property
    def heartbeat_interval(self) -> float:
        return self.config.nodeagent.heartbeat_interval

    @property
    def stop_grace(self) -> float:
        return self.config.nodeagent.stop_grace

    def log_file(self, endpoint_id: int) -> Path:
        """Where one endpoint's engine writes stdout and stderr."""
        return self.log_dir / f"engine-{self.node_id}-ep{endpoint_id}.log"


def parse_devices(text: str | None) -> tuple[str, ...]:
    """`"0,1, 2"` -> ("0", "1", "2"); empty or None -> ()."""
    if not text:
        return ()
    return tuple(d.strip() for d in text.split(",") if d.strip())


def split_devices(devices: tuple[str, ...], endpoints: int, index: int) -> tuple[str, ...]:
    """The devices of endpoint `index` when `endpoints` share the node's devices evenly."""
    if not devices:
        return ()
    if len(devices) % endpoints:
        raise StartupError(
            f"--devices lists {len(devices)} devices, not divisible by the {endpoints} endpoints of this node"
        )
    per = len(devices) // endpoints
    return devices[index * per : (index + 1) * per]


def device_env(name: str, devices: tuple[str, ...]) -> dict[str, str]:
    """The pinning environment for one endpoint; nothing when the node lists no devices."""
    return {name: ",".join(devices)} if devices else {}
