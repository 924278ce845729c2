"""The hot path's request stats, rendered as Prometheus families at scrape time."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from coordinator.metrics import CoordinatorMetrics


def _samples(m: CoordinatorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_requests_counted_by_route_and_status() -> None:
    m = CoordinatorMetrics()
    m.stats.observe("chat", 200, 0.003, 0.001)
    m.stats.observe("chat", 200, 0.02, None)
    m.stats.count("chat", 429)
    m.stats.count("other", 404)
    s = _samples(m)
    assert s[("motor_coordinator_requests_total", (("route", "chat"), ("status", "200")))] == 2
    assert s[("motor_coordinator_requests_total", (("route", "chat"), ("status", "429")))] == 1
    assert s[("motor_coordinator_requests_total", (("route", "other"), ("status", "404")))] == 1


def test_latency_histogram_is_cumulative_with_inclusive_bounds() -> None:
    m = CoordinatorMetrics()
    for v in (0.005, 0.0051, 0.3, 1000.0):  # on a bound, just above it, middle, above the last
        m.stats.observe("completions", 200, v, v / 2)
    s = _samples(m)

    def bucket(name: str, le: str) -> float:
        return s[(name, (("le", le), ("route", "completions")))]

    lat = "motor_coordinator_request_seconds_bucket"
    assert bucket(lat, "0.005") == 1  # 0.005 <= 0.005
    assert bucket(lat, "0.01") == 2
    assert bucket(lat, "0.25") == 2
    assert bucket(lat, "0.5") == 3
    assert bucket(lat, "600.0") == 3
    assert bucket(lat, "+Inf") == 4
    assert s[("motor_coordinator_request_seconds_count", (("route", "completions"),))] == 4
    assert abs(s[("motor_coordinator_request_seconds_sum", (("route", "completions"),))] - 1000.3101) < 1e-9
    assert bucket("motor_coordinator_ttft_seconds_bucket", "+Inf") == 4
    assert bucket("motor_coordinator_ttft_seconds_bucket", "0.0025") == 1


def test_ttft_skipped_when_unknown() -> None:
    m = CoordinatorMetrics()
    m.stats.observe("chat", 502, 0.1, None)
    s = _samples(m)
    assert s[("motor_coordinator_ttft_seconds_count", (("route", "chat"),))] == 0
    assert s[("motor_coordinator_request_seconds_count", (("route", "chat"),))] == 1
