"""`motor events` argument parsing and formatting (pure)."""

from __future__ import annotations

import pytest

from deploy.eventfmt import BadArgument, parse_position, range_of, short_time, summarize
from streams.log import Range

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("120", ("seq", 120)),
        ("10m", ("time", NOW - 600)),
        ("2h", ("time", NOW - 7200)),
        ("1.5d", ("time", NOW - 1.5 * 86400)),
        ("30s", ("time", NOW - 30)),
        ("1764410000.5", ("time", 1764410000.5)),
        ("2026-11-29T10:42:01", ("time", 1795948921.0)),
        ("2026-11-29T10:42:01+01:00", ("time", 1795948921.0 - 3600)),
    ],
)
def test_parse_position(text: str, want: tuple[str, float]) -> None:
    assert parse_position(text, "--since", now=NOW) == want


@pytest.mark.parametrize("text", ["yesterday", "10x", "-5", "", "¹"])
def test_bad_position_names_the_flag(text: str) -> None:
    with pytest.raises(BadArgument, match="--until"):
        parse_position(text, "--until", now=NOW)


def test_range_of() -> None:
    assert range_of(("seq", 5), ("time", 9.5)) == Range(start_seq=5, until_time=9.5)
    assert range_of(("time", 1.0), ("seq", 7), "motor.evt.>") == Range(
        start_time=1.0, until_seq=7, filter_subject="motor.evt.>"
    )
    assert range_of(None, None) == Range()


def test_summarize_leaves_out_empty_values() -> None:
    data = {"node_id": "n1", "reason": "", "exit_code": None, "endpoints": [], "level": "L2", "n": 3}
    assert summarize(data) == "node_id=n1 level=L2 n=3"


def test_short_time_is_utc() -> None:
    assert short_time(0) == "-"
    assert short_time(1795948921.25) == "11-29 10:42:01.250"
