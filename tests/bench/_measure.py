"""What the benches read off other processes: CPU from /proc, samples and histograms from /metrics."""

from __future__ import annotations

import os
from pathlib import Path

Buckets = list[tuple[float, float]]  # (upper bound, cumulative count), +Inf last


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _labels_match(line: str, name: str, labels: dict[str, str]) -> bool:
    if not line.startswith(name):
        return False
    rest = line[len(name) :]
    if rest.startswith(" "):
        return not labels
    return rest.startswith("{") and all(f'{k}="{v}"' in rest.split("}", 1)[0] for k, v in labels.items())


def sample(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The value of one sample in Prometheus text (0 when absent)."""
    for line in text.splitlines():
        if _labels_match(line, name, labels or {}):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def samples_sum(text: str, name: str) -> float:
    """The sum of every sample of a family, whatever its labels."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in (" ", "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def histogram(text: str, name: str, labels: dict[str, str] | None = None) -> Buckets:
    """A histogram's cumulative buckets, in the order exposed."""
    out: Buckets = []
    for line in text.splitlines():
        if _labels_match(line, f"{name}_bucket", labels or {}):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    return out


def delta(after: Buckets, before: Buckets) -> Buckets:
    """What was observed between two scrapes of one histogram."""
    if not before:
        return after
    return [(le, a - b) for (le, a), (_, b) in zip(after, before, strict=True)]


def count(buckets: Buckets) -> int:
    """Observations in all."""
    return int(buckets[-1][1]) if buckets else 0


def p99_ms(buckets: Buckets) -> float:
    """The upper bound (ms) of the bucket holding the 99th percentile; nan with no observation."""
    total = count(buckets)
    if not total:
        return float("nan")
    for le, n in buckets:
        if n >= 0.99 * total:
            return le * 1000
    return float("inf")
