"""`just test` runs the seeded simulation's first 200 fault schedules (CI runs 2,000 in `just sim
2000`): the whole control plane in one process, each seed judged on the invariants, a failing
seed named with the command that replays it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SEEDS = 200


# ~30 s on an idle 2-core machine; a machine busy with other work takes several times that.
@pytest.mark.timeout(1500)
def test_200_seeded_schedules_hold_every_invariant() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "tests.sim", str(SEEDS)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1400,
    )
    print(run.stdout)
    assert run.returncode == 0, (
        f"failing seeds (replay each with `just sim --seed N`):\n{run.stdout}{run.stderr}"
    )
    assert f"sim: {SEEDS} seeds (0..{SEEDS - 1}), 0 failed" in run.stdout
