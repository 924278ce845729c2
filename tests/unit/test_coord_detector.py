"""Precision detector: garbage is flagged, ordinary text (lists, code, tables) is not."""

from __future__ import annotations

import random

import pytest

from coordinator.detector import PrecisionDetector, garbage_reason
from core.coordconfig import PrecisionDetectorConfig


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("NaN " * 40, "NaN-like"),
        ("the value is nan nan nan nan nan inf -inf nan nan nan nan", "NaN-like"),
        ("<unk>" * 30, "NaN-like"),
        ("\ufffd" * 50 + " broken", "NaN-like"),
        ("the " * 60, "token repeated"),
        ("I am fine. I am fine. " + "of the " * 40, "2-token phrase"),
        ("!" * 300, "one character repeated"),
    ],
)
def test_garbage_is_flagged(text: str, fragment: str) -> None:
    reason = garbage_reason(text)
    assert reason is not None and fragment in reason


@pytest.mark.parametrize(
    "text",
    [
        "Paris is the capital of France. It lies on the Seine and is known for its museums.",
        "Bananas are rich in potassium; nanotechnology and infinite loops are other topics entirely.",
        "| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n| 5 | 6 |\n| 7 | 8 |",
        "for i in range(10):\n    print(i)\n" * 5,
        "- item one\n- item two\n- item three\n- item four\n- item five\n- item six",
        "short nan",
        "A loss of NaN means the learning rate was too high; lower it and try again please.",
        "=" * 80 + "\nHeader\n" + "=" * 80,
    ],
)
def test_ordinary_text_passes(text: str) -> None:
    assert garbage_reason(text) is None


def test_sampling_is_off_by_default_and_follows_the_rate() -> None:
    assert not any(PrecisionDetector().should_sample() for _ in range(1000))
    det = PrecisionDetector(PrecisionDetectorConfig(enabled=True, sample_rate=0.25), rng=random.Random(1))
    hits = sum(det.should_sample() for _ in range(4000))
    assert 800 < hits < 1200


def test_alarm_event_is_deterministic_per_request() -> None:
    det = PrecisionDetector()
    a = det.alarm(
        d_instance_id=2, p_instance_id=1, reason="r", request_id="req-1", source="coordinator/x", ts=1.0
    )
    b = det.alarm(
        d_instance_id=2, p_instance_id=1, reason="r", request_id="req-1", source="coordinator/x", ts=2.0
    )
    assert a.id == b.id == a.data.alarm_id
    assert (a.type, a.data.d_instance_id, a.data.p_instance_id, a.data.detector) == (
        "precision.alarm_raised",
        2,
        1,
        "coordinator",
    )
