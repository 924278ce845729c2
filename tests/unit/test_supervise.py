"""The restart rule of `motor up`'s supervisor (deploy/supervise.py): backoff and status lines."""

from __future__ import annotations

import pytest

from deploy.supervise import Backoff, Notice

B = Backoff(initial=0.5, factor=2.0, maximum=10.0, stable_after=30.0)


@pytest.mark.parametrize(
    ("streak", "uptime", "delay", "new_streak"),
    [
        (0, 1.0, 0.5, 1),  # first crash: the initial delay
        (1, 1.0, 1.0, 2),  # crash again soon: doubled
        (2, 0.1, 2.0, 3),
        (4, 0.1, 8.0, 5),
        (5, 0.1, 10.0, 6),  # capped
        (12, 0.1, 10.0, 13),
        (7, 30.0, 0.5, 1),  # stayed up long enough: a new streak
        (7, 29.9, 10.0, 8),
    ],
)
def test_backoff_doubles_caps_and_resets_after_a_stable_run(
    streak: int, uptime: float, delay: float, new_streak: int
) -> None:
    assert B.next(streak, uptime) == (delay, new_streak)


@pytest.mark.parametrize(
    ("notice", "line"),
    [
        (
            Notice("coordinator-1", "restarted", -9, 0.5, 2),
            "restarted coordinator-1 (exit -9) after 0.5 s, 2 restarts",
        ),
        (
            Notice("controller-c1", "restarted", 1, 1.0, 1),
            "restarted controller-c1 (exit 1) after 1 s, 1 restart",
        ),
        (Notice("nats-server", "exited", -9, 2.0, 0), "nats-server exited (exit -9); restarting in 2 s"),
        (
            Notice("nodeagent-union-0", "failed", 1, 4.0, 3, detail="port in use"),
            "could not restart nodeagent-union-0 (exit 1): port in use; trying again",
        ),
        (
            Notice(
                "coordinator-2",
                "unresponsive",
                None,
                0.0,
                0,
                detail="3 probes in a row unanswered, silent 3.1 s",
            ),
            "coordinator-2 stopped answering its liveness probe (3 probes in a row unanswered, "
            "silent 3.1 s): killed to take it out of the port, a fresh one follows; if this "
            "repeats, its log says what it was doing",
        ),
        (
            Notice("nats-server", "wedged", None, 0.0, 0, detail="its store cannot be written: no space"),
            "nats-server is wedged (its store cannot be written: no space): killed, a fresh one follows "
            "on the same store; if this repeats, see its log and the disk under its store",
        ),
        (
            Notice(
                "nats-server", "stuck", None, 0.0, 0, detail="cannot write its store (…): free disk space"
            ),
            "nats-server cannot write its store (…): free disk space",
        ),
    ],
)
def test_notice_lines(notice: Notice, line: str) -> None:
    assert notice.describe() == line
