"""Engine load from its Prometheus `/metrics` text (vLLM and SGLang metric names)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import aiohttp

from core.bounds import MAX_COUNT
from core.events import Capacity

RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")


@dataclass(frozen=True, slots=True)
class Load:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0  # 0..1

    def avail_slots(self, cap: Capacity) -> int:
        return max(0, cap.total_slots - self.running)

    def avail_blocks(self, cap: Capacity) -> int:
        usage = min(max(self.kv_usage, 0.0), 1.0)
        return max(0, math.floor(cap.total_blocks * (1.0 - usage)))


def parse_samples(text: str) -> dict[str, float]:
    """Sum of every sample per metric name (label sets of one metric added up)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        brace = line.find("{")
        if brace >= 0:
            name = line[:brace]
            close = line.rfind("}")
            rest = line[close + 1 :].split()
        else:
            parts = line.split()
            name, rest = parts[0], parts[1:]
        if not rest:
            continue
        try:
            value = float(rest[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def _first(samples: dict[str, float], names: tuple[str, ...]) -> float | None:
    for n in names:
        if n in samples:
            return samples[n]
    return None


def _count(value: float | None) -> int:
    """A request count as a heartbeat may carry it (`core.bounds`): an engine that misreports
    (negative, +Inf, 1e30) must not make the node's heartbeats poison or its loop raise."""
    if value is None or not value > 0:  # NaN is not > 0 either
        return 0
    return MAX_COUNT if value >= MAX_COUNT else int(value)


def load_from_text(text: str) -> Load:
    """The load an engine reports in its metrics text."""
    s = parse_samples(text)
    return Load(
        running=_count(_first(s, RUNNING)),
        waiting=_count(_first(s, WAITING)),
        kv_usage=float(_first(s, KV_USAGE) or 0.0),
    )


async def scrape(session: aiohttp.ClientSession, url: str, http_timeout: float) -> Load | None:
    """Fetch and parse `/metrics`; None when the engine does not answer."""
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=http_timeout)) as resp:
            if resp.status != 200:
                return None
            return load_from_text(await resp.text())
    except (TimeoutError, aiohttp.ClientError, OSError, UnicodeDecodeError):
        return None
