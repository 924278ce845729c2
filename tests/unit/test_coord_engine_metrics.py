"""Engine metrics relabelled with instance/role/node, merged across engines; Prometheus SD targets."""

from __future__ import annotations

from coordinator.enginemetrics import merge, node_of, parse_labels, relabel, sd_targets

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="m"} 1.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 3.0
vllm:odd{role="theirs",note="a \\"quoted\\", value"} 1
"""

ROW = {"key": "n1/0", "instance_id": 3, "role": "prefill", "host": "10.0.0.2", "port": 9000,
       "engine_type": "vllm", "model": "m"}  # fmt: skip
LABELS = {"instance_id": "3", "role": "prefill", "node": "n1", "endpoint": "n1/0"}


def test_samples_get_our_labels_and_an_engine_label_of_the_same_name_is_replaced() -> None:
    fams = dict(relabel(VLLM, LABELS))
    running = fams["vllm:num_requests_running"]
    assert running[:2] == [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
    ]
    assert running[2] == (
        'vllm:num_requests_running{instance_id="3",role="prefill",node="n1",endpoint="n1/0",'
        'engine="0",model_name="m"} 2.0'
    )
    ttft = fams["vllm:time_to_first_token_seconds"]
    assert sum(1 for ln in ttft if not ln.startswith("#")) == 2
    odd = fams["vllm:odd"][0]
    assert 'role="prefill"' in odd and "theirs" not in odd and 'note="a \\"quoted\\", value"' in odd


def test_merge_keeps_one_header_per_family_and_every_engines_samples() -> None:
    other = {**LABELS, "instance_id": "4", "node": "n2", "endpoint": "n2/0"}
    text = merge([relabel(VLLM, LABELS), relabel(VLLM, other)])
    assert text.count("# TYPE vllm:num_requests_running gauge") == 1
    assert 'instance_id="3"' in text and 'instance_id="4"' in text
    lines = text.splitlines()
    head = lines.index("# TYPE vllm:num_requests_running gauge")
    assert lines[head + 1].startswith("vllm:num_requests_running{") and lines[head + 2].startswith(
        "vllm:num_requests_running{"
    )


def test_label_parser_keeps_escapes() -> None:
    assert parse_labels('a="x",b="y\\"z",c=""') == [("a", "x"), ("b", 'y\\"z'), ("c", "")]


def test_sd_targets_list_every_engine_with_its_labels() -> None:
    ext = {**ROW, "key": "ext/7", "instance_id": 7, "role": "union", "port": 9100}
    assert sd_targets([ROW, ext]) == [
        {"targets": ["10.0.0.2:9000"], "labels": {**LABELS, "engine_type": "vllm", "model": "m",
                                                 "__metrics_path__": "/metrics"}},
        {"targets": ["10.0.0.2:9100"], "labels": {"instance_id": "7", "role": "union", "node": "external",
                                                 "endpoint": "ext/7", "engine_type": "vllm", "model": "m",
                                                 "__metrics_path__": "/metrics"}},
    ]  # fmt: skip
    assert node_of("prefill-0/1") == "prefill-0"


def test_addresses_that_are_no_engine_are_never_fetched() -> None:
    # A registration is written by anyone holding a node's credentials, and /metrics/engines
    # hands back what was fetched: the cloud's metadata service must not be one of them.
    from coordinator.enginemetrics import unscrapable

    for host in ("169.254.169.254", "fe80::1", "0.0.0.0", "::", "224.0.0.1", "255.255.255.255", "240.0.0.1"):
        assert unscrapable(host) is not None, host
    assert "not an IP address" in str(unscrapable("metadata.google.internal"))
    for host in ("10.0.0.2", "127.0.0.1", "198.18.0.11", "::1", "[::1]", "localhost"):
        assert unscrapable(host) is None, host


async def test_the_scraper_refuses_a_metadata_address_without_a_request() -> None:
    import time

    from coordinator.enginemetrics import EngineScraper

    row = {**ROW, "key": "evil/0", "host": "169.254.169.254", "port": 80}
    scraper = EngineScraper(lambda: [row], interval=30.0)
    await scraper.start()
    try:
        started = time.monotonic()
        await scraper.scrape_once()
        assert time.monotonic() - started < 1.0  # nothing dialled (it would wait for a timeout)
        assert "evil/0" not in scraper.latest and scraper.render() == b""
    finally:
        await scraper.stop()
