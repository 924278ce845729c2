"""Real vLLM engines for the tests: sections, launches through the node agent's backend, timing.

`VllmProc` starts exactly what the node agent would (the backend's argv, env and dirs), so a
direct test proves the backend against the real engine before the whole cluster is involved.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from core.config import EngineSection
from core.events import EndpointSpec, Role
from nodeagent.backends import backend_for
from nodeagent.backends.launch import LaunchContext, LaunchSpec
from tests.integration.nodeagent_harness import MARKER, free_port, kill_marked

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
LAUNCHER = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.cli.main"]
# Tiny model, CPU: 256 tokens of context, no torch.compile (40 s instead of ~100 s to start),
# float32 so P/D and union agree bit for bit, 32-token blocks so a ~80-token prompt spans
# whole blocks that a KV connector moves (the CPU default is 128).
ENGINE_CONFIG: dict[str, Any] = {
    "max_model_len": 256,
    "enforce_eager": True,
    "dtype": "float32",
    "block_size": 32,
    "max_num_seqs": 8,
}
STARTUP_TIMEOUT = 900.0  # seconds; ~40 s on an idle 2-core machine, minutes under load


def engine_section(
    model_dir: Path,
    *,
    kv_transfer_config: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    dispatch_profile: str | None = None,
) -> dict[str, Any]:
    """An engine section (as config data) for a real vLLM serving the tiny model."""
    engine_config = dict(ENGINE_CONFIG)
    if kv_transfer_config is not None:
        engine_config["kv_transfer_config"] = kv_transfer_config
    return {
        "engine_type": "vllm",
        "model": "tiny",
        "model_path": str(model_dir),
        "launcher": LAUNCHER,
        "engine_config": engine_config,
        # 1 GiB of KV cache is plenty for the tiny model; the default would take a share of RAM.
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})},
        "dispatch_profile": dispatch_profile,
        "health_check_config": {"interval": 1.0, "timeout": 5.0, "startup_timeout": STARTUP_TIMEOUT},
    }


def example_connector(shared_dir: Path) -> dict[str, Any]:
    """ExampleConnector: KV through files in a shared dir (both sides `kv_both`)."""
    return {
        "kv_connector": "ExampleConnector",
        "kv_connector_extra_config": {"shared_storage_path": str(shared_dir)},
    }


def nixl_connector() -> dict[str, Any]:
    """NixlConnector with host (CPU) buffers; UCX over TCP (the backend sets UCX_TLS)."""
    return {"kv_connector": "NixlConnector", "kv_buffer_device": "cpu"}


def launch_spec(
    section: dict[str, Any], role: Role, port: int, bootstrap_port: int | None = None
) -> LaunchSpec:
    """What the node agent would launch for this section on 127.0.0.1:`port`."""
    sec = EngineSection.model_validate(section)
    ep = EndpointSpec(id=0, ip="127.0.0.1", business_port=port, mgmt_port=port, bootstrap_port=bootstrap_port)
    ctx = LaunchContext(section=sec, role=role, instance_id=0, endpoint=ep, master_dp_ip="127.0.0.1")
    return backend_for("vllm").launch(ctx)


class VllmProc:
    """One `vllm serve` started from the backend's launch spec, marked for cleanup."""

    def __init__(self, section: dict[str, Any], role: Role, log_dir: Path, name: str) -> None:
        self.section = section
        self.port = free_port()
        self.bootstrap_port = free_port()
        self.spec = launch_spec(section, role, self.port, self.bootstrap_port)
        self.log = log_dir / f"vllm-{name}-{self.port}.log"
        self.marker = f"vllm-{name}-{self.port}-{os.getpid()}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> VllmProc:
        for d in self.spec.dirs:
            os.makedirs(d, exist_ok=True)
        env = {**os.environ, **self.section.get("env", {}), **self.spec.env, MARKER: self.marker}
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(
                self.spec.argv,
                env=env,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return self

    def wait_healthy(self, timeout: float = STARTUP_TIMEOUT) -> float:
        """Poll /health until 200 (nothing to await: the engine only answers HTTP); seconds taken."""
        assert self.proc is not None
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"vLLM exited with {self.proc.returncode} while starting:\n{self.tail()}"
                )
            if http_status(f"{self.url}/health") == 200:
                self.startup_s = time.monotonic() - t0
                return self.startup_s
            time.sleep(1.0)
        raise AssertionError(f"vLLM not healthy within {timeout:.0f}s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM the main process first (vLLM then shuts its workers down), then the group."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        kill_marked(self.marker)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def __enter__(self) -> VllmProc:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def http_status(url: str, timeout: float = 5.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (OSError, urllib.error.URLError):
        return None


def post_json(url: str, body: dict[str, Any], timeout: float = 120.0) -> dict[str, Any]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


def get_text(url: str, timeout: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return str(r.read().decode())


def metric(text: str, name: str) -> float:
    """Sum of a Prometheus metric's samples (all label sets) in an exposition text."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total
