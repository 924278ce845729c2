"""Prometheus metrics of the builtin engine, under vLLM's names.

The hot path only bumps plain ints and lists (a few hundred nanoseconds); the Prometheus
families are built at scrape time by a custom collector on a per-engine registry. Gauges are
read from the engine when scraped, so they are never stale and cost nothing per request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from core.histogram import Histogram

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# vLLM's buckets for these two histograms.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


def _family(h: Histogram, name: str, doc: str, labels: list[str], values: list[str]) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=labels)
    fam.add_metric(values, h.cumulative(), h.total)
    return fam


class EngineMetrics(Collector):
    """Counters and histograms of one engine, plus gauges read on scrape."""

    def __init__(self, model_name: str, gauges: Callable[[], tuple[int, int, float]]) -> None:
        self.model_name = model_name
        self._gauges = gauges  # () -> (running, waiting, kv usage 0..1)
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.finished: dict[str, int] = {"stop": 0, "length": 0, "abort": 0, "error": 0}
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def render(self) -> bytes:
        """The Prometheus text exposition of this engine."""
        return generate_latest(self.registry)

    def collect(self) -> Iterator[Metric]:
        labels, values = ["engine", "model_name"], ["0", self.model_name]
        running, waiting, usage = self._gauges()
        for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage),
        ):
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            yield g
        for name, doc, count in (
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", self.generation_tokens),
            ("vllm:prefix_cache_queries", "Prefix cache queries, in terms of tokens.", self.prefix_queries),
            ("vllm:prefix_cache_hits", "Prefix cache hits, in terms of tokens.", self.prefix_hits),
        ):
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, count)
            yield c
        success = CounterMetricFamily(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels=[*labels, "finished_reason"],
        )
        for reason, count in self.finished.items():
            success.add_metric([*values, reason], count)
        yield success
        yield _family(
            self.ttft,
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            values,
        )
        yield _family(
            self.itl,
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
            values,
        )
        yield _family(
            self.e2e,
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            labels,
            values,
        )
