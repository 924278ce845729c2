"""The controller's appender says a full MOTOR once every FULL_SAID_EVERY seconds, not on every
decide tick (five lines a second in the motor_full chaos scenario); other failures every time."""

from __future__ import annotations

import pytest

from controller import appender as mod
from controller.appender import FULL_SAID_EVERY, Appender
from streams.errors import PublishTimeout, StoreFull


@pytest.mark.parametrize(
    ("errors", "said"),
    [
        ([(0.0, "full"), (0.2, "full"), (FULL_SAID_EVERY - 0.1, "full")], [True, False, False]),
        ([(0.0, "full"), (FULL_SAID_EVERY, "full")], [True, True]),
        ([(0.0, "full"), (0.2, "timeout"), (0.4, "timeout")], [True, True, True]),
    ],
)
def test_a_full_store_is_said_once_every_while(
    monkeypatch: pytest.MonkeyPatch, errors: list[tuple[float, str]], said: list[bool]
) -> None:
    a = Appender.__new__(Appender)  # only the rate limit: no log, fold or metrics needed
    a._full_said_at = None
    got = []
    for at, kind in errors:
        monkeypatch.setattr(mod.time, "monotonic", lambda at=at: 1000.0 + at)
        err = StoreFull("MOTOR is at its nats.max_bytes") if kind == "full" else PublishTimeout("no ack")
        got.append(a._say(err))
    assert got == said
