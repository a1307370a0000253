"""Latency from a summary or a pair of counters: the mean of each interval (and a summary's own
quantiles), from real prometheus-client servers and from the expositions MLServer, TorchServe and a
Go summary write; bad input is a clear problem, never a crash."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.errors import ProbeError
from agent.core.records import ProbeTarget
from probes.latency import LatencyProbe, interval_result, read_scrape
from support.latency_app import start_app

SUMMARY = {"summary": "request_duration_seconds", "labels": {"route": "/work"}}
COUNTERS = {
    "counters": {"total": "inference_latency_microseconds", "count": "inference_requests"},
    "unit": "microseconds",
    "errors_counter": "request_errors",
}
QUANTILES = ("latency_p50_seconds", "latency_p90_seconds", "latency_p99_seconds", "latency_p999_seconds")


def target_for(url: str, spec: dict) -> ProbeTarget:
    return ProbeTarget("svc", 1, 100.0, {}, {"latency": {"prometheus": {"url": url, "timeout": 2.0, **spec}}})


def values(result) -> dict[str, float]:
    return {s.metric: s.value for s in result.samples}


@pytest.fixture
def probe() -> Iterator[LatencyProbe]:
    latency = LatencyProbe()
    yield latency
    latency.close()


@pytest.mark.parametrize("spec", [SUMMARY, COUNTERS], ids=["summary", "counters"])
def test_the_mean_of_each_interval_from_a_real_server(spawn, probe, spec):
    app = start_app(spawn)
    target = target_for(app.url(), spec)
    assert probe.collect(target, time.time()).samples == []  # the baseline
    with httpx.Client(timeout=10) as client:
        for round_ms in ((5, 15, 25), (40, 60)):
            seen = len(app.observed())
            for ms in round_ms * 4:
                assert client.get(app.url(f"/work?ms={ms}")).status_code == 200
            result = probe.collect(target, time.time())
            raw = app.observed()[seen:]
            got = values(result)
            assert result.problems == []
            assert got["latency_mean_seconds"] == pytest.approx(sum(raw) / len(raw), rel=1e-6)
            assert got["request_rate"] > 0 and not set(got) & set(QUANTILES)  # a mean is not a p99


# a Go client's summary: quantiles over its own 10 minute window, NaN when that window is empty
GO_SUMMARY = """# HELP rpc_duration_seconds RPC latency.
# TYPE rpc_duration_seconds summary
rpc_duration_seconds{service="a",quantile="0.5"} {p50}
rpc_duration_seconds{service="a",quantile="0.9"} 0.02
rpc_duration_seconds{service="a",quantile="0.99"} {p99}
rpc_duration_seconds_sum{service="a"} {total}
rpc_duration_seconds_count{service="a"} {count}
rpc_duration_seconds{service="b",quantile="0.99"} NaN
rpc_duration_seconds_sum{service="b"} 0
rpc_duration_seconds_count{service="b"} 0
"""
# TorchServe 0.8+ in prometheus mode: counters without `_total`, a trailing comma in each label set
TORCHSERVE = """# HELP ts_inference_latency_microseconds Cumulative inference duration in microseconds
# TYPE ts_inference_latency_microseconds counter
ts_inference_latency_microseconds{model_name="ranker",model_version="default",hostname="p-1",} {total}
# HELP ts_inference_requests_total Total number of inference requests.
# TYPE ts_inference_requests_total counter
ts_inference_requests_total{model_name="ranker",model_version="default",hostname="p-1",} {count}
"""


def go(total: float, count: float, p50: str = "0.01", p99: str = "0.08") -> str:
    return (
        GO_SUMMARY.replace("{total}", str(total))
        .replace("{count}", str(count))
        .replace("{p50}", p50)
        .replace("{p99}", p99)
    )


def interval(spec: dict, before: str, after: str):
    first = read_scrape(before, None, spec, 100.0)
    return interval_result("svc", first, read_scrape(after, None, spec, 110.0), 110.0)


def test_a_summary_of_one_series_gives_its_own_quantiles_beside_the_mean():
    spec = {"summary": "rpc_duration_seconds", "labels": {"service": "a"}}
    result = interval(spec, go(1.0, 100), go(3.0, 150))
    got = values(result)
    assert got["latency_mean_seconds"] == pytest.approx(2.0 / 50)
    assert (got["latency_p50_seconds"], got["latency_p90_seconds"], got["latency_p99_seconds"]) == (
        0.01,
        0.02,
        0.08,
    )
    assert result.problems == [] and got["request_rate"] == pytest.approx(5.0)


def test_the_quantiles_of_several_series_are_not_combined():
    """Both series' means add up (sum of times over sum of counts); their quantiles cannot."""
    spec = {"summary": "rpc_duration_seconds"}
    result = interval(spec, go(1.0, 100, p99="0.5"), go(3.0, 150, p99="0.5").replace("NaN", "0.9"))
    got = values(result)
    assert got["latency_mean_seconds"] == pytest.approx(2.0 / 50) and "latency_p99_seconds" not in got
    assert "the quantiles of 2 series of rpc_duration_seconds cannot be combined" in str(result.problems[0])
    assert "narrow latency.prometheus.labels" in str(result.problems[0])


def test_torchserve_counters_in_microseconds():
    spec = {
        "counters": {"total": "ts_inference_latency_microseconds", "count": "ts_inference_requests_total"},
        "unit": "microseconds",
        "labels": {"model_name": "ranker"},
    }
    before = TORCHSERVE.replace("{total}", "2511000.058").replace("{count}", "40.0")
    after = TORCHSERVE.replace("{total}", "4511000.058").replace("{count}", "60.0")
    got = values(interval(spec, before, after))
    assert got["latency_mean_seconds"] == pytest.approx(0.1)  # 2 s spent on 20 requests
    assert got["request_rate"] == pytest.approx(2.0)


def test_a_counter_reset_counts_from_zero():
    """A server that restarts its counters (a model reloaded) is not a negative latency."""
    spec = {"summary": "rpc_duration_seconds", "labels": {"service": "a"}}
    got = values(interval(spec, go(100.0, 1000), go(0.5, 10)))
    assert got["latency_mean_seconds"] == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("spec", "body", "message"),
    [
        (
            {"summary": "request_latency_seconds"},
            '# TYPE request_latency_seconds histogram\nrequest_latency_seconds_bucket{le="+Inf"} 1\n',
            "request_latency_seconds is a histogram, not a summary; use latency.prometheus.histogram",
        ),
        (
            {"histogram": "rpc_duration_seconds"},
            go(1.0, 10),
            "rpc_duration_seconds is a summary, not a histogram; use latency.prometheus.summary",
        ),
        (
            {"counters": {"total": "busy_seconds", "count": "served"}},
            "# TYPE busy_seconds gauge\nbusy_seconds 3\n# TYPE served counter\nserved_total 4\n",
            "busy_seconds is a gauge, not a counter: medic needs a running total that only grows; "
            "check latency.prometheus.counters.total",
        ),
        (
            {"counters": {"total": "busy_seconds", "count": "served"}},
            "# TYPE busy_seconds counter\nbusy_seconds_total 3\n",
            "no counter 'served' in the exposition; check latency.prometheus.counters.count",
        ),
        (
            {"summary": "nope_seconds"},
            go(1.0, 10),
            "no summary 'nope_seconds' in the exposition (summaries there: rpc_duration_seconds)",
        ),
        (
            {"summary": "rpc_duration_seconds", "labels": {"service": "c"}},
            go(1.0, 10),
            "no series of rpc_duration_seconds has the labels {'service': 'c'}",
        ),
        (
            {"summary": "rpc_duration_seconds"},
            "# TYPE rpc_duration_seconds summary\nrpc_duration_seconds_sum 1\n",
            "lacks its _sum or its _count",
        ),
        (
            {"summary": "rpc_duration_seconds"},
            '# TYPE rpc_duration_seconds summary\nrpc_duration_seconds{quantile="high"} 1\n',
            "has no valid 'quantile' label (got 'high')",
        ),
    ],
)
def test_a_wrong_family_is_a_clear_error(spec, body, message):
    with pytest.raises(ProbeError) as caught:
        read_scrape(body, None, spec, 1.0, source="http://x/metrics")
    assert message in str(caught.value)


def test_nan_in_the_totals_is_a_problem_and_no_figure():
    spec = {"summary": "rpc_duration_seconds", "labels": {"service": "a"}}
    result = interval(spec, go(1.0, 100), go(float("nan"), 150))
    assert "latency_mean_seconds" not in values(result)
    assert "no mean latency: nan spent on 50 requests" in str(result.problems[0])


figure = st.one_of(
    st.floats(-1e3, 1e12, allow_nan=False),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0]),
)


@settings(max_examples=300, deadline=None)
@given(
    before=st.lists(st.tuples(figure, figure), min_size=1, max_size=3),
    after=st.lists(st.tuples(figure, figure), min_size=1, max_size=3),
    unit=st.sampled_from(["seconds", "milliseconds", "microseconds"]),
    kind=st.sampled_from(["summary", "counters"]),
)
def test_any_figures_give_a_finite_mean_or_a_problem(before, after, unit, kind):
    """Resets, NaN, infinities and negative figures in any series: no exception, and every mean
    stored is a finite latency of at least zero."""

    def page(rows: list[tuple[float, float]]) -> str:
        if kind == "summary":
            lines = ["# TYPE s summary"]
            for i, (total, count) in enumerate(rows):
                lines += [f's_sum{{k="{i}"}} {total!r}', f's_count{{k="{i}"}} {count!r}']
        else:
            lines = ["# TYPE t counter", "# TYPE c counter"]
            for i, (total, count) in enumerate(rows):
                lines += [f't_total{{k="{i}"}} {total!r}', f'c_total{{k="{i}"}} {count!r}']
        return "\n".join(lines).replace("nan", "NaN").replace("inf", "Inf") + "\n"

    spec = {"summary": "s"} if kind == "summary" else {"counters": {"total": "t", "count": "c"}}
    spec["unit"] = unit
    result = interval(spec, page(before), page(after))
    for sample in result.samples:
        assert math.isfinite(sample.value)
        if sample.metric == "latency_mean_seconds":
            assert sample.value >= 0
