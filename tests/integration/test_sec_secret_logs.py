"""Secrets stay out of log lines (issue 12, item 5): a NATS URL's password is masked in what a
component logs while it cannot reach NATS, and in what a CLI prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.coord_harness import ROOT, free_port

PASSWORD = "pw-sekret-42"


def test_a_nats_password_is_masked_in_a_components_log(tmp_path: Path) -> None:
    url = f"nats://motor:{PASSWORD}@127.0.0.1:{free_port()}"  # nobody listens there
    log = tmp_path / "coordinator.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.cli", "coordinator", "--nats-url", url, "--port", "0"],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while "unreachable" not in log.read_text(errors="replace"):
            assert proc.poll() is None, log.read_text(errors="replace")
            assert time.monotonic() < deadline, "the coordinator never said NATS is unreachable"
            time.sleep(0.1)  # polling a log file: there is no event to await
    finally:
        proc.kill()
        proc.wait(10)
    text = log.read_text(errors="replace")
    assert PASSWORD not in text
    assert "nats://motor:***@127.0.0.1" in text


def test_a_nats_password_is_masked_in_what_a_cli_prints() -> None:
    url = f"nats://motor:{PASSWORD}@127.0.0.1:{free_port()}"
    out = subprocess.run(
        [sys.executable, "-m", "deploy.cli", "events", "ls", "--nats-url", url],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode != 0
    assert PASSWORD not in out.stdout + out.stderr
    assert "motor:***@" in out.stderr
