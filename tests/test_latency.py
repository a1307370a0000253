"""The latency probe against real HTTP servers exposing a real prometheus-client histogram."""

from __future__ import annotations

import bisect
import math
import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from agent.core.errors import ProbeError
from agent.core.records import ProbeTarget
from probes.latency import LatencyProbe, interval_result, read_scrape
from probes.registry import PROBES, create_probe
from support.latency_app import start_app
from support.procs import PATIENCE

BOUNDS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, math.inf]
SPEC = {
    "histogram": "request_latency_seconds",
    "labels": {"route": "/work"},
    "requests_counter": "requests",
    "errors_counter": "request_errors_total",
}


def target_for(url: str, pid: int = 1, start: float = 100.0, **extra) -> ProbeTarget:
    spec = {**SPEC, "url": url, "timeout": 2.0, **extra}
    return ProbeTarget("svc", pid, start, {}, {"latency": {"prometheus": spec}})


def values(result) -> dict[str, float]:
    return {s.metric: s.value for s in result.samples}


def drive(app, latencies_ms: list[float], workers: int = 16) -> None:
    with httpx.Client(timeout=10) as client, ThreadPoolExecutor(workers) as pool:
        for response in pool.map(lambda ms: client.get(app.url(f"/work?ms={ms:.3f}")), latencies_ms):
            assert response.status_code == 200


@pytest.fixture
def probe() -> Iterator[LatencyProbe]:
    """A latency probe whose kept-alive connections are closed at teardown."""
    latency = LatencyProbe()
    yield latency
    latency.close()


def bucket_of(value: float) -> tuple[float, float]:
    index = bisect.bisect_left(BOUNDS, value)
    return (BOUNDS[index - 1] if index else 0.0), BOUNDS[index]


def test_quantiles_match_the_raw_latencies_within_bucket_resolution(spawn, probe):
    app = start_app(spawn)
    target = target_for(app.url())
    rng = random.Random(42)
    scraped = time.time()
    assert probe.collect(target, scraped).samples == []  # the first scrape is the baseline
    for _round in range(2):
        seen = len(app.observed())
        drive(app, [min(400.0, rng.lognormvariate(math.log(20), 0.8)) for _ in range(240)])
        before, scraped = scraped, time.time()
        result = probe.collect(target, scraped)
        raw = sorted(app.observed()[seen:])
        got = values(result)
        assert result.problems == []
        for q, metric in (
            (0.5, "latency_p50_seconds"),
            (0.9, "latency_p90_seconds"),
            (0.99, "latency_p99_seconds"),
        ):
            truth = raw[math.ceil(q * len(raw)) - 1]
            low, high = bucket_of(truth)
            assert low <= got[metric] <= high, (metric, truth, got[metric])
        assert got["latency_mean_seconds"] == pytest.approx(sum(raw) / len(raw), rel=1e-6)
        # the 240 requests over the time between the two scrapes, as the probe stamped them
        assert got["request_rate"] == pytest.approx(240 / (scraped - before))
        assert got["error_rate"] == 0 and got["error_ratio"] == 0


def test_error_rate_and_no_traffic(spawn, probe):
    app = start_app(spawn)
    target = target_for(app.url())
    probe.collect(target, time.time())
    with httpx.Client() as client:
        for i in range(20):
            client.get(app.url(f"/work?ms=1{'&fail=1' if i % 4 == 0 else ''}"))
    got = values(probe.collect(target, time.time()))
    assert got["error_ratio"] == pytest.approx(5 / 20)
    quiet = values(probe.collect(target, time.time()))
    assert quiet["request_rate"] == 0 and quiet["error_rate"] == 0
    assert not any(metric.startswith("latency_") for metric in quiet)  # no traffic: no quantiles, no error


def test_text_and_openmetrics_give_the_same_snapshot():
    registry = CollectorRegistry()
    latency = Histogram("request_latency_seconds", "latency", ["route"], registry=registry)
    requests = Counter("requests", "requests", ["code"], registry=registry)
    Counter("request_errors", "errors", registry=registry)
    for value in (0.003, 0.02, 0.02, 0.3, 4.0):
        latency.labels("/work").observe(value)
        latency.labels("/other").observe(value * 10)
        requests.labels("200").inc()
    text = read_scrape(generate_latest(registry), "text/plain; version=0.0.4", SPEC, 1.0)
    om = read_scrape(generate_openmetrics(registry), "application/openmetrics-text; version=1.0.0", SPEC, 1.0)
    assert text == om
    assert list(text.histogram) == [(("route", "/work"),)]  # the label filter picked one series
    assert text.requests == {(("code", "200"),): 5.0} and text.errors == {(): 0.0}


def test_counter_reset_between_scrapes_counts_from_zero():
    def scrape(observations: list[float], errors: int, now: float):
        registry = CollectorRegistry()
        latency = Histogram("request_latency_seconds", "latency", ["route"], registry=registry)
        requests = Counter("requests", "requests", ["code"], registry=registry)
        Counter("request_errors", "errors", registry=registry).inc(errors)
        for value in observations:
            latency.labels("/work").observe(value)
            requests.labels("200").inc()
        return read_scrape(generate_latest(registry), None, SPEC, now)

    before = scrape([0.02] * 100, 10, 0.0)
    after = scrape([0.3] * 7, 1, 5.0)  # a fresh process behind the same URL: every counter went down
    got = values(interval_result("svc", before, after, 5.0))
    assert got["request_rate"] == pytest.approx(7 / 5) and got["error_rate"] == pytest.approx(1 / 5)
    assert 0.25 <= got["latency_p50_seconds"] <= 0.5


@pytest.mark.parametrize(
    ("path", "extra", "message"),
    [
        ("/garbage", {}, r"line 1: expected a metric name.*is this URL a /metrics endpoint"),
        ("/observed", {}, r"line 1: expected a metric name"),  # JSON
        ("/hang", {"timeout": 0.5}, r"did not answer within 0.5s .*latency.prometheus.timeout"),
        ("/drip", {"timeout": 0.5}, r"did not answer within 0.5s .*latency.prometheus.timeout"),
        ("/close", {}, r"closed the connection without a complete answer"),
        ("/metrics", {"histogram": "nope_seconds"}, r"no histogram 'nope_seconds'.*request_latency_seconds"),
        ("/metrics", {"histogram": "requests"}, r"requests is a counter, not a histogram"),
        ("/metrics", {"labels": {"route": "/x"}}, r"no series of request_latency_seconds has the labels"),
        ("/metrics", {"errors_counter": "missing_total"}, r"no counter 'missing_total'"),
    ],
)
def test_broken_targets_give_a_clear_probe_error(spawn, probe, path, extra, message):
    app = start_app(spawn)
    httpx.get(app.url("/work?ms=1"))  # the histogram has a series
    started = time.monotonic()
    with pytest.raises(ProbeError, match=message):
        probe.collect(target_for(app.url(path), **extra), time.time())
    assert time.monotonic() - started < 3.0 * PATIENCE
    assert probe._previous == {}  # nothing kept from a failed scrape


def test_refused_connection_and_http_errors(spawn):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nobody listens there
    with pytest.raises(ProbeError, match=r"cannot connect to .*is the server up"):
        LatencyProbe().collect(target_for(f"http://127.0.0.1:{port}/metrics"), time.time())


def test_new_process_is_a_new_baseline_and_forget_drops_state(spawn, probe):
    app = start_app(spawn)
    first, second = target_for(app.url(), pid=10, start=1.0), target_for(app.url(), pid=11, start=2.0)
    probe.collect(first, time.time())
    drive(app, [5.0] * 10)
    assert values(probe.collect(first, time.time()))["request_rate"] > 0
    assert probe.collect(second, time.time()).samples == []  # a restarted process starts a new baseline
    probe.forget(first)
    assert probe.collect(first, time.time()).samples == []
    assert set(probe._previous) == {(10, 1.0), (11, 2.0)}


def test_registered_default_on_and_silent_without_config():
    assert PROBES["latency"].default_enabled and PROBES["canary"].default_enabled
    for name in ("latency", "canary"):
        probe = create_probe(name)
        assert probe.name == name and probe.schedule == "fast"
        result = probe.collect(ProbeTarget("svc", 1, 1.0, {}, {"name": "svc", "latency": None}), time.time())
        assert result.samples == [] and result.problems == []
