"""Start builtin engines as real processes for tests (free ports, READY line, clean stop).

Usable from any test: `with BuiltinEngineProc(tmp_path, "--fast") as eng: eng.url`.
The engine prints `READY ...` on stdout once it listens; its log goes to a file.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BuiltinEngineProc:
    """One `python -m simengine` process (the command line the node agent uses)."""

    def __init__(self, log_dir: Path, *args: str, port: int | None = None, name: str = "engine") -> None:
        self.port = port or free_port()
        self.args = list(args)
        self.log_path = log_dir / f"{name}-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> BuiltinEngineProc:
        """Spawn the engine and wait for its READY line."""
        cmd = [sys.executable, "-m", "simengine", "--port", str(self.port), *self.args]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log, start_new_session=True, env={**os.environ}
            )
        assert self.proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        line = b""
        try:
            while time.monotonic() < deadline:
                if not sel.select(timeout=deadline - time.monotonic()):
                    break
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    break
                line += chunk
                if b"READY" in line:
                    return self
        finally:
            sel.close()
        self.stop()
        raise RuntimeError(f"engine did not start: {line!r}\n{self.log()}")

    def log(self) -> str:
        """The engine's log so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def wait_exit(self, timeout: float = 30.0) -> int:
        """Wait for the process to exit on its own; its exit code."""
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL after a grace period."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> BuiltinEngineProc:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def http(
    method: str, url: str, body: object = None, timeout: float = 30.0, raw: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One plain HTTP request (no SDK): (status, lower-cased headers, body)."""
    import http.client
    import json
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    try:
        payload = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        path = parts.path + (f"?{parts.query}" if parts.query else "")
        conn.request(method, path, body=payload, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()
