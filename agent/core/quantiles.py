"""Quantiles of the observations made between two scrapes of a Prometheus histogram.

`interval_histogram(earlier, later)` is the bucket-wise `increase()` of every series between two
scrapes, summed by `le`; `bucket_quantile(q, buckets)` is PromQL's `histogram_quantile` on such
buckets. Together they give `histogram_quantile(q, sum by (le) (increase(h_bucket[interval])))`,
which REFERENCE §8.1 checked against promtool to the last digit.

Where this differs from PromQL, on purpose:
- a series whose `_count` or any bucket went down was reset (its process restarted): its whole
  later scrape is the increase, rather than bucket by bucket, so that a bucket that happens to
  hold more after the reset than before is not undercounted;
- a series that appears in the later scrape only (a new label value) counts from zero: client
  libraries create a series at its first observation, and PromQL would lose those observations;
- `increase()`'s extrapolation to the window edges is left out: it scales every bucket of a
  series alike, so it does not change a quantile.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

LabelKey = tuple[tuple[str, str], ...]  # the labels of one series except `le`, sorted


@dataclass(frozen=True, slots=True)
class HistogramSeries:
    """One series of a histogram at one scrape: cumulative count per upper bound, `_count`, `_sum`."""

    buckets: Mapping[float, float]
    count: float | None = None
    sum: float | None = None


Snapshot = Mapping[LabelKey, HistogramSeries]


@dataclass(frozen=True, slots=True)
class IntervalHistogram:
    """Observations between two scrapes: per-bound cumulative counts summed over the series."""

    buckets: dict[float, float]
    count: float  # observations in the interval (`_count` deltas, else the +Inf bucket's)
    sum: float | None  # their total (seconds for a latency histogram), when every series has `_sum`
    resets: int = 0  # series found reset (counted from zero)
    series: int = 0  # series that contributed
    notes: list[str] = field(default_factory=list)

    def quantile(self, q: float) -> float:
        """`histogram_quantile(q, …)` of the interval; NaN when it holds no observation."""
        return bucket_quantile(q, self.buckets.items())

    @property
    def mean(self) -> float:
        if self.sum is None or self.count <= 0:
            return math.nan
        return self.sum / self.count


def bucket_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float:
    """The q-quantile of cumulative `(upper_bound, count)` buckets, as PromQL's `histogram_quantile`.

    Linear interpolation inside the bucket that holds rank `q × total`, from 0 (or the previous
    bound) to its upper bound; the second-highest bound when the rank falls in `+Inf`; NaN with
    no `+Inf` bucket, fewer than two buckets, or no observations; -Inf / +Inf for q < 0 / q > 1.
    Equal bounds are merged and counts made monotonic, as Prometheus does.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    merged: dict[float, float] = {}
    for bound, count in buckets:
        if math.isnan(bound):
            continue
        merged[bound] = merged.get(bound, 0.0) + count
    if not merged:
        return math.nan
    bounds = sorted(merged)
    if bounds[-1] != math.inf or len(bounds) < 2:
        return math.nan
    counts = _monotonic([merged[b] for b in bounds])
    total = counts[-1]
    if not total > 0:
        return math.nan
    rank = q * total
    index = next((i for i, c in enumerate(counts[:-1]) if c >= rank), len(counts) - 1)
    if index == len(counts) - 1:
        return bounds[-2]
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    start, below = (bounds[index - 1], counts[index - 1]) if index > 0 else (0.0, 0.0)
    in_bucket = counts[index] - below
    if in_bucket == 0:
        return math.nan  # q == 0 with an empty first bucket: 0/0 in PromQL too
    return start + (bounds[index] - start) * ((rank - below) / in_bucket)


def _monotonic(counts: list[float]) -> list[float]:
    """Counts with float noise (relative 1e-12) smoothed out, then any decrease raised to the max so far."""
    out = list(counts)
    previous = out[0]
    for i in range(1, len(out)):
        current = out[i]
        if current != previous and current != 0 and abs(current - previous) / abs(current) <= 1e-12:
            out[i] = previous
        else:
            previous = current
    highest = out[0]
    for i in range(1, len(out)):
        if out[i] < highest:
            out[i] = highest
        else:
            highest = out[i]
    return out


def series_increase(earlier: HistogramSeries | None, later: HistogramSeries) -> tuple[HistogramSeries, bool]:
    """The observations one series gained between two scrapes, and whether it was reset meanwhile.

    Bounds present in only one of the scrapes are left out (as PromQL's `increase` would); a reset
    (any count lower than before) makes the later scrape the increase.
    """
    if earlier is None:
        return later, False
    reset = (earlier.count is not None and later.count is not None and later.count < earlier.count) or any(
        later.buckets[b] < c for b, c in earlier.buckets.items() if b in later.buckets
    )
    if reset:
        return later, True
    buckets = {b: later.buckets[b] - c for b, c in earlier.buckets.items() if b in later.buckets}
    count = later.count - earlier.count if later.count is not None and earlier.count is not None else None
    total = later.sum - earlier.sum if later.sum is not None and earlier.sum is not None else None
    return HistogramSeries(buckets, count, total), False


def interval_histogram(earlier: Snapshot, later: Snapshot) -> IntervalHistogram:
    """`sum by (le) (increase(h_bucket))` between two scrapes of the series selected from one histogram."""
    buckets: dict[float, float] = {}
    count = 0.0
    total: float | None = 0.0
    resets = 0
    notes: list[str] = []
    for key, series in later.items():
        delta, reset = series_increase(earlier.get(key), series)
        resets += reset
        for bound, value in delta.buckets.items():
            buckets[bound] = buckets.get(bound, 0.0) + value
        if delta.count is not None:
            count += delta.count
        else:
            count += delta.buckets.get(math.inf, 0.0)
        total = total + delta.sum if total is not None and delta.sum is not None else None
        if math.inf not in series.buckets:
            notes.append(f"series {_show(key)} has no +Inf bucket")
    return IntervalHistogram(buckets, count, total, resets, len(later), notes)


def _show(key: LabelKey) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in key) + "}"
