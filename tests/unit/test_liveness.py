"""The liveness rule of `motor up`'s supervisor (deploy/liveness.py): when silence kills."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy.liveness import MAX_UNIX_PATH, LivenessRule, Probing, Verdict, probe_dir

RULE = LivenessRule(interval=0.5, timeout=1.0, misses=3)
A, M = True, False  # a probe answered, a probe missed


@pytest.mark.parametrize(
    ("probes", "verdicts"),
    [
        # Never answered: starting, not in the port yet; no silence counts, however long.
        ([M] * 10, ["waiting"] * 10),
        ([M, M, A, M, M, M], ["waiting", "waiting", "alive", "missed", "missed", "kill"]),
        ([A, M, M, M], ["alive", "missed", "missed", "kill"]),
        # An answer resets the count: misses must come in a row.
        ([A, M, M, A, M, M, A], ["alive", "missed", "missed", "alive", "missed", "missed", "alive"]),
        ([A, A, A], ["alive"] * 3),
    ],
)
def test_misses_in_a_row_after_a_first_answer_kill(probes: list[bool], verdicts: list[str]) -> None:
    seen = Probing()
    got = []
    for answered in probes:
        seen, verdict = RULE.step(seen, answered)
        got.append(verdict.value)
    assert got == verdicts


def test_one_miss_kills_when_the_rule_says_one() -> None:
    seen, verdict = LivenessRule(misses=1).step(Probing(answered=True), False)
    assert verdict is Verdict.KILL and seen.misses == 1


def test_kill_within_bounds_a_freeze_by_the_slower_of_interval_and_timeout() -> None:
    assert RULE.kill_within == 4.0  # (3 misses + the probe in flight) × 1.0 s
    assert LivenessRule(interval=1.0, timeout=0.2, misses=2).kill_within == 3.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"interval": 0.0}, "liveness interval"),
        ({"interval": float("nan")}, "liveness interval"),
        ({"timeout": -1.0}, "liveness timeout"),
        ({"timeout": float("inf")}, "liveness timeout"),
        ({"timeout": 61.0}, "liveness timeout"),
        ({"misses": 0}, "liveness misses"),
        ({"misses": 101}, "liveness misses"),
    ],
)
def test_rule_refuses_what_cannot_work(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LivenessRule(**kwargs)  # type: ignore[arg-type]


def test_probe_dir_is_the_root_unless_the_socket_path_would_be_too_long(tmp_path: Path) -> None:
    names = ["coordinator-1", "coordinator-2"]
    assert probe_dir(tmp_path, "s1", names) == tmp_path / "run"
    deep = tmp_path / ("d" * (MAX_UNIX_PATH - len(str(tmp_path))))
    short = probe_dir(deep, "s1", names)
    assert short.name == "motor-s1" and len(str(short / "coordinator-2.sock")) <= MAX_UNIX_PATH
