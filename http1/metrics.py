"""Scrape-time Prometheus view of a server's watchdogs: connections open, requests refused."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from http1.conn import Watchdog


class HttpCollector(Collector):
    """`<prefix>_http_connections` and `<prefix>_http_rejected_total{status,code}` of the
    watchdogs `add`ed (a server may listen on several ports)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.watchdogs: list[Watchdog] = []

    def add(self, watchdog: Watchdog) -> None:
        """Count this watchdog's connections and refusals too."""
        self.watchdogs.append(watchdog)

    def collect(self) -> Iterator[Metric]:
        """Yield the gauges and counters, summed over the watchdogs."""
        conns = GaugeMetricFamily(f"{self.prefix}_http_connections", "Open client connections")
        conns.add_metric([], sum(len(w.conns) for w in self.watchdogs))
        yield conns
        rejected = CounterMetricFamily(
            f"{self.prefix}_http_rejected",
            "Requests and connections refused by the HTTP limits, timeouts or a failing handler",
            labels=["status", "code"],
        )
        totals: dict[tuple[int, str], int] = {}
        for w in self.watchdogs:
            for key, n in w.rejects.items():
                totals[key] = totals.get(key, 0) + n
        for (status, code), n in sorted(totals.items()):
            rejected.add_metric([str(status), code], n)
        yield rejected
