"""Every Prometheus object of the coordinator, in one registry per coordinator.

Per-endpoint numbers the hot path already keeps on `Endpoint` (in-flight, load) are read at
scrape time by `TableCollector`, so the proxy pays nothing per request for them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client import Histogram as PromHistogram  # core.histogram.Histogram is the lock-free one
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from coordinator.table import RoutingTable
from core.histogram import Histogram

# Latency buckets (seconds) for LLM requests: a few ms for a cached JSON hop up to many minutes.
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_TTFT = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)

BREAKER_CLOSED, BREAKER_HALF_OPEN, BREAKER_OPEN = 0, 1, 2


class TableCollector(Collector):
    """Scrape-time view of the routing table: endpoints, their load and in-flight counts."""

    def __init__(self, table: RoutingTable, caught_up: Callable[[], bool] | None = None) -> None:
        self.table = table
        self.caught_up = caught_up

    def collect(self) -> Iterator[Metric]:
        """Yield the table's gauges."""
        t = self.table
        inflight = GaugeMetricFamily(
            "motor_coordinator_endpoint_inflight",
            "Requests in flight from this coordinator",
            labels=["endpoint", "role"],
        )
        load = GaugeMetricFamily(
            "motor_coordinator_endpoint_load",
            "Running + waiting requests per endpoint, from heartbeats",
            labels=["endpoint", "role"],
        )
        routable = GaugeMetricFamily(
            "motor_coordinator_routable_endpoints",
            "Routable endpoints by role and model",
            labels=["role", "model"],
        )
        counts: dict[tuple[str, str], int] = {}
        for e in t.routable():
            inflight.add_metric([e.key, e.role.value], e.inflight)
            load.add_metric([e.key, e.role.value], e.running + e.waiting)
            k = (e.role.value, e.model)
            counts[k] = counts.get(k, 0) + 1
        for (role, model), n in sorted(counts.items()):
            routable.add_metric([role, model], n)
        yield inflight
        yield load
        yield routable
        yield GaugeMetricFamily(
            "motor_coordinator_table_version",
            "Routing table version (bumps on routability changes)",
            value=t.version,
        )
        yield GaugeMetricFamily(
            "motor_coordinator_log_seq", "MOTOR stream sequence folded into the table", value=t.last_seq
        )
        if self.caught_up is not None:
            yield GaugeMetricFamily(
                "motor_coordinator_caught_up",
                "1 once the table caught up with the log",
                value=int(self.caught_up()),
            )


class RequestStats(Collector):
    """Per-request counters of the hot path: requests by route and status, latency and TTFT.

    Plain ints and lists updated without a lock (the proxy runs on one event loop) and turned
    into Prometheus families at scrape time; prometheus_client's locked values cost several
    times more per request than the routing decision they count.
    """

    def __init__(self) -> None:
        self.requests: dict[tuple[str, int], int] = {}
        self.latency: dict[str, Histogram] = {}
        self.ttft: dict[str, Histogram] = {}

    def count(self, route: str, status: int) -> None:
        """One finished request (no timing: refused before routing)."""
        key = (route, status)
        self.requests[key] = self.requests.get(key, 0) + 1

    def observe(self, route: str, status: int, seconds: float, ttft: float | None) -> None:
        """One routed request: its status, latency to the last byte and time to first byte."""
        key = (route, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        lat = self.latency.get(route)
        if lat is None:
            lat = self.latency[route] = Histogram(_LATENCY)
            self.ttft[route] = Histogram(_TTFT)
        lat.observe(seconds)
        if ttft is not None:
            self.ttft[route].observe(ttft)

    def collect(self) -> Iterator[Metric]:
        """Yield the families (names as prometheus_client's Counter/Histogram would give)."""
        req = CounterMetricFamily(
            "motor_coordinator_requests",
            "Client requests by route and HTTP status",
            labels=["route", "status"],
        )
        for (route, status), n in sorted(self.requests.items()):
            req.add_metric([route, str(status)], n)
        yield req
        for name, doc, hists in (
            ("motor_coordinator_request_seconds", "Client request latency to the last byte", self.latency),
            ("motor_coordinator_ttft_seconds", "Time to the first response byte of a request", self.ttft),
        ):
            fam = HistogramMetricFamily(name, doc, labels=["route"])
            for route, h in sorted(hists.items()):
                fam.add_metric([route], h.cumulative(), h.total)
            yield fam


class CoordinatorMetrics:
    """The coordinator's Prometheus objects, in their own registry (no module globals)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.stats = RequestStats()
        r.register(self.stats)
        self.retries = Counter(
            "motor_coordinator_retries",
            "Upstream attempts retried on another endpoint",
            ["reason"],
            registry=r,
        )
        self.continuations = Counter(
            "motor_coordinator_continuations",
            "Streams continued on another path after their engine died or stalled mid-stream",
            registry=r,
        )
        self.whole_folded = Counter(
            "motor_coordinator_whole_folded",
            "Whole (non-streamed) answers asked of their engine as a stream and folded into one "
            "body, so that an engine failure midway can be continued (continue_whole_from_tokens)",
            registry=r,
        )
        self.whole_continuations = Counter(
            "motor_coordinator_whole_continuations",
            "Whole (non-streamed) answers continued on another path from the text folded so far "
            "after their engine died or stalled midway",
            registry=r,
        )
        self.readmitted = Counter(
            "motor_coordinator_readmitted",
            "Endpoints a request had excluded after a failure and tried again once they were READY as a new process",
            registry=r,
        )
        self.moved = Counter(
            "motor_coordinator_moved",
            "Engine exchanges ended because their endpoint left routing (health, instance state, "
            "an opened circuit): the request went on elsewhere at once",
            registry=r,
        )
        self.hedges = Counter(
            "motor_coordinator_hedges",
            "Requests sent on a second path after no first byte within their endpoint's recent "
            "time to first byte × hedge.factor, by which attempt answered first",
            ["winner"],
            registry=r,
        )
        self.upstream_errors = Counter(
            "motor_coordinator_upstream_errors", "Failed upstream attempts", ["endpoint", "kind"], registry=r
        )
        self.breaker_state = Gauge(
            "motor_coordinator_breaker_state",
            "Circuit breaker per endpoint and role: 0 closed, 1 half-open, 2 open",
            ["endpoint", "role"],
            registry=r,
        )
        self.breaker_trips = Counter(
            "motor_coordinator_breaker_trips", "Times a circuit opened", ["endpoint", "role"], registry=r
        )
        self.breaker_resets = Counter(
            "motor_coordinator_breaker_resets",
            "Open circuits closed because their endpoint came back as a new process",
            ["endpoint", "role"],
            registry=r,
        )
        self.fault_events = Counter(
            "motor_coordinator_fault_events",
            "Circuit and stream events appended to the log",
            ["type"],
            registry=r,
        )
        self.fault_events_dropped = Counter(
            "motor_coordinator_fault_events_dropped",
            "Circuit and stream events dropped because NATS was away too long and the queue was full",
            ["reason"],
            registry=r,
        )
        self.rate_limited = Counter(
            "motor_coordinator_rate_limited", "Requests refused with 429", ["reason"], registry=r
        )
        self.aborts = Counter(
            "motor_coordinator_client_aborts",
            "Requests the client abandoned before the end",
            ["route"],
            registry=r,
        )
        self.precision_checks = Counter(
            "motor_coordinator_precision_checks", "Responses sampled by the precision detector", registry=r
        )
        self.precision_alarms = Counter(
            "motor_coordinator_precision_alarms", "Precision alarms raised", ["detector"], registry=r
        )
        self.refreshes = Counter(
            "motor_coordinator_instance_refreshes",
            "POST /v1/instances/refresh by result",
            ["result"],
            registry=r,
        )
        self.alarm_clears = Counter(
            "motor_coordinator_alarm_clears", "POST /precision/alarm_cleared calls", registry=r
        )
        self.engine_scrapes = Counter(
            "motor_coordinator_engine_scrapes",
            "Scrapes of engines' /metrics (re-exposed on /metrics/engines), by result",
            ["endpoint", "result"],
            registry=r,
        )
        # The fold of the log (streams.livefold): what it skipped and how often the log was lost.
        self.events_skipped = Counter(
            "motor_coordinator_events_skipped",
            "Events the fold skipped: undecodable, unknown_type, newer_schema, wrong_subject, inapplicable",
            ["reason"],
            registry=r,
        )
        self.fold_lag = PromHistogram(
            "motor_coordinator_fold_lag_seconds",
            "How far the table is behind the log: from an event's append (the stream's timestamp) "
            "to its fold into the table, once caught up, by stream (MOTOR events, MOTOR_HB heartbeats)",
            ["stream"],
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0),
            registry=r,
        )
        self.log_lost = Counter(
            "motor_coordinator_log_lost",
            "Times the log was found purged, recreated or rewound (the table is kept and the new log folded on top)",
            registry=r,
        )
        self._table_collector: TableCollector | None = None

    def bind_table(self, table: RoutingTable, caught_up: Callable[[], bool] | None = None) -> None:
        """Expose the routing table's per-endpoint gauges at scrape time (once)."""
        if self._table_collector is None:
            self._table_collector = TableCollector(table, caught_up)
            self.registry.register(self._table_collector)

    def render(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)
