"""Interval quantiles: PromQL's `histogram_quantile` semantics, checked against promtool itself."""

from __future__ import annotations

import bisect
import math
import random
import shutil
import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.quantiles import HistogramSeries, bucket_quantile, interval_histogram, series_increase

INF = math.inf
# REFERENCE §8.1: 2000 observations, then the interval between two scrapes (verified with promtool)
CUMULATIVE = {
    0.005: 189,
    0.01: 447,
    0.025: 1000,
    0.05: 1505,
    0.1: 1505,
    0.25: 1772,
    0.5: 1772,
    1.0: 2000,
    INF: 2000,
}
DELTA = {0.005: 0, 0.01: 0, 0.025: 0, 0.05: 505, 0.1: 505, 0.25: 772, 0.5: 772, 1.0: 1000, INF: 1000}


def test_reference_figures_of_the_verified_scrapes():
    assert bucket_quantile(0.5, DELTA.items()) == pytest.approx(0.049752, abs=1e-6)
    assert bucket_quantile(0.9, DELTA.items()) == pytest.approx(0.780702, abs=1e-6)
    assert bucket_quantile(0.99, DELTA.items()) == pytest.approx(0.978070, abs=1e-6)
    assert bucket_quantile(0.5, CUMULATIVE.items()) == pytest.approx(0.025, abs=1e-6)
    assert bucket_quantile(0.9, CUMULATIVE.items()) == pytest.approx(0.561404, abs=1e-6)
    assert bucket_quantile(0.99, CUMULATIVE.items()) == pytest.approx(0.956140, abs=1e-6)
    earlier = {(): HistogramSeries({b: c - DELTA[b] for b, c in CUMULATIVE.items()}, 1000.0, 100.0)}
    later = {(): HistogramSeries(CUMULATIVE, 2000.0, 241.5)}
    interval = interval_histogram(earlier, later)
    assert interval.buckets == DELTA and interval.count == 1000 and interval.mean == pytest.approx(0.1415)
    assert interval.quantile(0.99) == bucket_quantile(0.99, DELTA.items())


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.5, {1.0: 2, 2.0: 4}, math.nan),  # no +Inf bucket
        (0.5, {INF: 4}, math.nan),  # fewer than two buckets
        (0.5, {1.0: 0, INF: 0}, math.nan),  # no observations
        (-0.1, {1.0: 2, INF: 4}, -INF),
        (1.1, {1.0: 2, INF: 4}, INF),
        (math.nan, {1.0: 2, INF: 4}, math.nan),
        (0.9, {1.0: 2, INF: 4}, 1.0),  # in the +Inf bucket: the highest finite bound
        (0.5, {1.0: 4, INF: 4}, 0.5),  # lower bound 0 in the first bucket
        (0.5, {-1.0: 4, 0.0: 4, INF: 4}, -1.0),  # first bound <= 0: the bound itself
        (0.5, {1.0: 2, 2.0: 1, 3.0: 4, INF: 4}, 1.0),  # non-monotonic counts are raised (2 → 2, 2, 4)
        (0.75, {1.0: 2, 2.0: 1, 3.0: 4, INF: 4}, 2.5),
        (0.0, {1.0: 0, 2.0: 4, INF: 4}, math.nan),  # q = 0 with an empty first bucket: 0/0
        (0.0, {1.0: 2, 2.0: 4, INF: 4}, 0.0),
        (1.0, {1.0: 2, 2.0: 4, INF: 4}, 2.0),
    ],
)
def test_histogram_quantile_special_cases(q, buckets, expected):
    got = bucket_quantile(q, buckets.items())
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)


def test_equal_bounds_are_merged_like_sum_by_le():
    assert bucket_quantile(0.5, [(1.0, 1), (1.0, 1), (2.0, 2), (2.0, 2), (INF, 2), (INF, 2)]) == 1.0


def test_counter_reset_takes_the_later_scrape_whole():
    earlier = HistogramSeries({0.1: 50, 1.0: 90, INF: 100}, 100, 20.0)
    later = HistogramSeries({0.1: 1, 1.0: 95, INF: 110}, 110, 30.0)  # 0.1 dropped: the process restarted
    delta, reset = series_increase(earlier, later)
    assert reset and delta == later  # 95 in the 1.0 bucket are all new, not 5
    delta, reset = series_increase(
        HistogramSeries({0.1: 5, INF: 9}, 9), HistogramSeries({0.1: 6, INF: 12}, 7)
    )
    assert reset  # `_count` went down


def test_interval_over_several_series_new_series_and_missing_buckets():
    earlier = {
        (("path", "/a"),): HistogramSeries({0.1: 10, 1.0: 20, INF: 20}, 20, 4.0),
        (("path", "/b"),): HistogramSeries({0.1: 0, 1.0: 5, 5.0: 5, INF: 5}, 5, 3.0),
    }
    later = {
        (("path", "/a"),): HistogramSeries({0.1: 15, 1.0: 30, INF: 30}, 30, 7.0),
        (("path", "/b"),): HistogramSeries({0.1: 0, 1.0: 6, INF: 7}, 7, 6.0),  # the 5.0 bucket vanished
        (("path", "/c"),): HistogramSeries({0.1: 2, 1.0: 2, INF: 2}, 2, 0.1),  # new: counted from zero
    }
    interval = interval_histogram(earlier, later)
    assert interval.buckets == {0.1: 7, 1.0: 13, INF: 14}
    assert interval.count == 14 and interval.series == 3 and interval.resets == 0
    assert interval.sum == pytest.approx(3.0 + 3.0 + 0.1)
    assert interval.notes == []
    broken = interval_histogram({}, {(): HistogramSeries({0.1: 1, 1.0: 2})})
    assert broken.notes == ["series {} has no +Inf bucket"] and math.isnan(broken.quantile(0.5))


BOUNDS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, INF]


def histogram_of(observations: list[float]) -> dict[float, float]:
    """Cumulative buckets as a client library keeps them (`le` is inclusive)."""
    ordered = sorted(observations)
    return {bound: float(bisect.bisect_right(ordered, bound)) for bound in BOUNDS}


def bucket_around(value: float) -> tuple[float, float]:
    """The (lower, upper] bucket of `value`."""
    index = bisect.bisect_left(BOUNDS, value)
    return (BOUNDS[index - 1] if index else 0.0), BOUNDS[index]


_latencies = st.lists(st.floats(min_value=0.0001, max_value=9.0), min_size=1, max_size=300)


@given(
    before=st.lists(st.floats(min_value=0.0001, max_value=9.0), max_size=200),
    during=_latencies,
    q=st.sampled_from([0.5, 0.9, 0.99, 0.999]),
)
@settings(max_examples=300)
def test_interval_quantile_is_the_quantile_of_the_interval_within_bucket_resolution(before, during, q):
    earlier = {(): HistogramSeries(histogram_of(before), float(len(before)))}
    later = {(): HistogramSeries(histogram_of(before + during), float(len(before) + len(during)))}
    interval = interval_histogram(earlier, later)
    got = interval.quantile(q)
    assert got == bucket_quantile(q, histogram_of(during).items())
    truth = sorted(during)[max(0, math.ceil(q * len(during)) - 1)]  # the order statistic at rank q·n
    low, high = bucket_around(truth)
    assert low <= got <= high, (truth, got)


@given(st.lists(st.tuples(st.floats(-10, 10), st.floats(0, 1000)), max_size=8), st.floats(-0.5, 1.5))
@settings(max_examples=500)
def test_fuzz_quantile_never_raises_and_is_monotonic_in_q(buckets, q):
    value = bucket_quantile(q, [*buckets, (INF, 1000.0)])
    assert isinstance(value, float)
    higher = bucket_quantile(min(q + 0.1, 1.0), [*buckets, (INF, 1000.0)])
    if 0 <= q <= 1 and not math.isnan(value) and not math.isnan(higher):
        assert higher >= value - 1e-9


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed"
)
def test_matches_promtool_histogram_quantile_over_increase(tmp_path):
    """40 random pairs of scrapes; promtool evaluates histogram_quantile(q, sum by (le) (increase(h[1m])))."""
    rng = random.Random(6)
    tests = []
    for case in range(40):
        bounds = sorted(
            rng.sample([0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10], rng.randint(2, 8))
        )
        before = [rng.expovariate(rng.choice([2, 20, 200])) for _ in range(rng.randint(0, 400))]
        during = [rng.expovariate(rng.choice([2, 20, 200])) for _ in range(rng.randint(1, 400))]
        first = {b: sum(x <= b for x in before) for b in [*bounds, INF]}
        second = {b: sum(x <= b for x in before + during) for b in [*bounds, INF]}
        restarted = {b: sum(x <= b for x in during) for b in [*bounds, INF]}
        if case % 5 == 4 and all(restarted[b] < first[b] for b in first if first[b] > 0):
            second = restarted  # the process restarted: PromQL sees the reset in every bucket too
        interval = interval_histogram(
            {(): HistogramSeries(first, float(first[INF]))}, {(): HistogramSeries(second, float(second[INF]))}
        )
        series = "\n".join(
            f"      - series: 'h_bucket{{le=\"{'+Inf' if b == INF else repr(float(b))}\"}}'\n"
            f"        values: '{first[b]} {second[b]}'"
            for b in first
        )
        exprs = []
        for q in (0.5, 0.9, 0.99, 0.999):
            value = interval.quantile(q)
            if math.isnan(value):
                continue
            exprs.append(
                f"      - expr: histogram_quantile({q}, sum by (le) (increase(h_bucket[1m])))\n"
                f"        eval_time: 1m\n"
                f"        exp_samples:\n"
                f"          - labels: '{{}}'\n"
                f"            value: {value!r}"
            )
        if exprs:
            tests.append(
                f"  - interval: 1m\n    input_series:\n{series}\n    promql_expr_test:\n" + "\n".join(exprs)
            )
    path = tmp_path / "quantiles_test.yml"
    path.write_text("evaluation_interval: 1m\ntests:\n" + "\n".join(tests) + "\n")
    result = subprocess.run(
        ["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
