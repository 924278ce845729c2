"""A seed is its run: the same seed twice, in this process or another with other string hashing,
writes the same log byte for byte (tests/sim/run.py says where each draw comes from)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from streams.definitions import MOTOR_STREAM
from tests.sim import run as sim_run
from tests.sim.checks import Check
from tests.sim.world import World

ROOT = Path(__file__).resolve().parents[2]
SEED = 7  # kills an engine mid-run: restarts, commands, a ladder step, all of it repeated


def digest(seed: int) -> str:
    got: list[str] = []

    async def log_digest(world: World) -> list[Check]:
        h = hashlib.sha256()
        for m in world.server.stream(MOTOR_STREAM).after(0, None):
            h.update(f"{m.seq} {m.subject} {m.ts!r} ".encode() + m.data)
        got.append(h.hexdigest())
        return []

    sim_run.run_seed(seed, then=log_digest)
    return got[0]


def test_the_same_seed_writes_the_same_log_twice() -> None:
    assert digest(SEED) == digest(SEED)


def test_another_process_with_other_string_hashing_writes_the_same_log() -> None:
    code = f"from tests.unit.test_sim_determinism import digest; print(digest({SEED}))"
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == digest(SEED)
