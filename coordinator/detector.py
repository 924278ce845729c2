"""Precision detector: does a response look like numerical garbage? Pure, sampled, off by default.

A broken P/D pair (wrong KV transferred, a bad device) rarely fails outright: it answers with
NaN-like tokens or one token repeated forever. `garbage_reason` spots those; `PrecisionDetector`
samples responses and builds the `precision.alarm_raised` event the coordinator appends, which
takes the pair's group out of routing until an operator clears it.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from core.coordconfig import PrecisionDetectorConfig
from core.events import PrecisionAlarmRaised, PrecisionAlarmRaisedData
from core.ids import derive_id

# Tokens a healthy model does not emit as a run of output.
_NAN_TOKEN = re.compile(r"(?i)(?<![a-z])(nan|-?inf|infinity|<unk>|<\|?unk\|?>|\ufffd)(?![a-z])")
_WORD = re.compile(r"\S+")


@dataclass(frozen=True, slots=True)
class DetectorLimits:
    """Thresholds: conservative so real text (tables, lists, code) does not trip them."""

    min_chars: int = 32  # shorter answers carry too little signal
    nan_fraction: float = 0.3  # share of NaN-like tokens among the words
    nan_min: int = 8
    repeat_run: int = 24  # the same word this many times in a row
    ngram_max: int = 4  # a phrase of up to this many words repeated ...
    ngram_repeats: int = 16  # ... this many times in a row
    char_run: int = 200  # one character repeated this many times (no spaces at all)


def garbage_reason(text: str, limits: DetectorLimits = DetectorLimits()) -> str | None:
    """Why `text` looks like numerical garbage, or None when it looks like language."""
    if len(text) < limits.min_chars:
        return None
    words = _WORD.findall(text)
    nan = len(_NAN_TOKEN.findall(text))
    if nan >= limits.nan_min and nan >= limits.nan_fraction * max(1, len(words)):
        return f"{nan} NaN-like tokens in {len(words)} words"
    run = _longest_char_run(text)
    if run >= limits.char_run:
        return f"one character repeated {run} times"
    for n in range(1, limits.ngram_max + 1):
        need = limits.repeat_run if n == 1 else limits.ngram_repeats
        reps = _longest_ngram_run(words, n)
        if reps >= need:
            what = "token" if n == 1 else f"{n}-token phrase"
            return f"a {what} repeated {reps} times in a row"
    return None


def _longest_char_run(text: str) -> int:
    best = run = 0
    prev = ""
    for ch in text:
        run = run + 1 if ch == prev else 1
        prev = ch
        if run > best:
            best = run
    return best


def _longest_ngram_run(words: list[str], n: int) -> int:
    """Longest count of back-to-back repeats of one n-word phrase."""
    best = 1 if words else 0
    for offset in range(n):
        run = 1
        prev: tuple[str, ...] | None = None
        for i in range(offset, len(words) - n + 1, n):
            gram = tuple(words[i : i + n])
            run = run + 1 if gram == prev else 1
            prev = gram
            if run > best:
                best = run
    return best


@dataclass
class PrecisionDetector:
    """Sample responses and check them; off unless `coordinator.precision_detector.enabled`."""

    config: PrecisionDetectorConfig = field(default_factory=PrecisionDetectorConfig)
    limits: DetectorLimits = field(default_factory=DetectorLimits)
    rng: random.Random = field(default_factory=random.Random)

    def should_sample(self) -> bool:
        """Whether to check this response (cheap; called per response)."""
        return self.config.enabled and self.rng.random() < self.config.sample_rate

    def check(self, text: str) -> str | None:
        """The garbage reason for a sampled response, or None."""
        return garbage_reason(text, self.limits)

    def alarm(
        self,
        *,
        d_instance_id: int,
        p_instance_id: int | None,
        reason: str,
        request_id: str,
        source: str,
        ts: float,
    ) -> PrecisionAlarmRaised:
        """The `precision.alarm_raised` event for a garbage response (id derived: retries dedupe)."""
        alarm_id = derive_id("precision", d_instance_id, p_instance_id, request_id)
        return PrecisionAlarmRaised(
            id=alarm_id,
            ts=ts,
            source=source,
            data=PrecisionAlarmRaisedData(
                alarm_id=alarm_id,
                d_instance_id=d_instance_id,
                p_instance_id=p_instance_id,
                reason=reason,
                detector="coordinator",
            ),
        )
