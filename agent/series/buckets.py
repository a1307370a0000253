"""Latency quantiles from recorded histogram buckets, as the latency probe makes them online.

A recording may hold a latency histogram's cumulative buckets instead of its quantiles: one series
per bound, named `<family>_bucket{le="<bound>"}` (how the Prometheus reader names `le`-labelled
`_bucket` series; JSON Lines may name them so too). Between two consecutive scrapes the bucket
deltas are the interval's observations, and `histogram_quantile` of them (`agent.core.quantiles`)
is the interval's p50 … p99.9, stored at the later scrape as `latency_p99_seconds` and the others:
the series the slow detector reads. A counter that went down was reset (a new process), so the
interval counts from zero. Instances that already have quantile series keep them.

`medic analyze` makes them from the reader's columns (`quantiles_from_columns`), before any point
tuple exists: when every bound of the family was scraped at the same strictly increasing times
(what a Prometheus export or a scrape loop gives) the C kernel `bucket_quantiles` computes every
interval from the count arrays at once; otherwise the points are aligned by time
(`interval_quantiles`). Once the quantile series is made only the first and last scrape of each
bucket column are kept (the span of the data), but for the instance's first series, which stays
whole (restarts are inferred from its gaps and drops when there is no RSS series): 30 M counts
would be 3 GB as point tuples, and only the quantile is judged.
"""

from __future__ import annotations

import math
import re
from array import array
from collections.abc import Collection, Iterable
from itertools import pairwise
from operator import lt
from typing import TYPE_CHECKING, TypeVar

from agent.core.quantiles import bucket_quantile
from agent.detect.model import InstanceSeries, Points
from agent.detect.slow.rules import QUANTILE_METRICS
from agent.detect.trend import _kernels

if TYPE_CHECKING:
    from agent.series.records import ImportResult

BUCKET = re.compile(r'^(?P<family>[A-Za-z_:][A-Za-z0-9_:]*)_bucket\{le="(?P<le>[^"]{1,40})"\}$')
MAX_BOUNDS = 64
T = TypeVar("T")


def parse_bound(text: str) -> float | None:
    """A bucket's upper bound (`0.25`, `+Inf`); None when it is not a number."""
    try:
        bound = float(text)
    except ValueError:
        return None
    return None if math.isnan(bound) or bound < 0 else bound


def families(series: InstanceSeries) -> dict[str, dict[float, Points]]:
    """The histogram families of an instance: family → bound → its cumulative count points."""
    return _grouped((metric, points) for metric, points in series.series.items() if points)


def _grouped(named: Iterable[tuple[str, T]]) -> dict[str, dict[float, T]]:
    """The `_bucket` series among `named` (metric, what to keep) by family and bound: the families
    with a `+Inf` bucket and at least one other, at most `MAX_BOUNDS` bounds each."""
    out: dict[str, dict[float, T]] = {}
    for metric, kept in named:
        match = BUCKET.match(metric)
        bound = parse_bound(match["le"]) if match else None
        if match is None or bound is None:
            continue
        bounds = out.setdefault(match["family"], {})
        if len(bounds) < MAX_BOUNDS:
            bounds[bound] = kept
    return {name: bounds for name, bounds in out.items() if math.inf in bounds and len(bounds) >= 2}


def interval_quantiles(
    bounds: dict[float, Points], wanted: Collection[str] | None = None
) -> dict[str, Points]:
    """p50 … p99.9 (those named in `wanted`, else all) of each interval between consecutive
    scrapes of the `+Inf` bucket."""
    at = {bound: dict(points) for bound, points in bounds.items()}
    times = [ts for ts, _ in bounds[math.inf]]
    quantiles = {q: m for q, m in QUANTILE_METRICS.items() if wanted is None or m in wanted}
    out: dict[str, Points] = {metric: [] for metric in quantiles.values()}
    for before, now in pairwise(times):
        deltas = []
        for bound, counts in at.items():
            if before not in counts or now not in counts:
                continue
            start, end = counts[before], counts[now]
            if not (math.isfinite(start) and math.isfinite(end)):
                continue
            deltas.append((bound, end - start if end >= start else end))  # a reset counts from zero
        for q, metric in quantiles.items():
            value = bucket_quantile(q, deltas)
            if math.isfinite(value):
                out[metric].append((now, value))
    return {metric: points for metric, points in out.items() if points}


def quantiles_from_buckets(
    instances: Iterable[InstanceSeries], wanted: Collection[str] | None = None
) -> list[str]:
    """Add quantile series made from bucket series to instances that have none (only the `wanted`
    quantile series, when given: each one costs a pass over every interval); the families used."""
    used: set[str] = set()
    for series in instances:
        if any(series.series.get(metric) for metric in QUANTILE_METRICS.values()):
            continue
        found = families(series)
        if not found:
            continue
        family = max(sorted(found), key=lambda name: len(found[name][math.inf]))  # the most scraped
        series.series.update(interval_quantiles(found[family], wanted))
        used.add(family)
    return sorted(used)


Columns = dict[str, tuple["array[float]", "array[float]"]]  # quoted: array is generic only to mypy on 3.10


def _column_families(metrics: Columns) -> dict[str, dict[float, str]]:
    """`families` over an instance's columns: family → bound → the metric name of its column."""
    return _grouped((metric, metric) for metric, (times, _) in metrics.items() if times)


def _aligned_quantiles(
    bounds: dict[float, str], metrics: Columns, wanted: Collection[str] | None
) -> Columns | None:
    """`interval_quantiles` from the count arrays in one kernel call per quantile, or None when
    the kernel is not built or the bounds were not all scraped at the same increasing times."""
    if _kernels is None or not hasattr(_kernels, "bucket_quantiles"):
        return None
    times = metrics[bounds[math.inf]][0]
    if not all(map(lt, times[:-1], times[1:])):
        return None
    order = sorted(bounds)
    # as bytes: comparing arrays of doubles makes a float of every item; equal bytes are equal
    # times, and times equal but for the sign of a zero only take the slower path
    scraped = times.tobytes()
    if any(metrics[bounds[bound]][0].tobytes() != scraped for bound in order):
        return None
    counts = b"".join(metrics[bounds[bound]][1].tobytes() for bound in order)
    limits = array("d", order).tobytes()
    later = times[1:]
    out = {}
    for q, metric in QUANTILE_METRICS.items():
        if wanted is not None and metric not in wanted:
            continue
        values = array("d")
        values.frombytes(_kernels.bucket_quantiles(limits, counts, q))
        if values and all(map(math.isfinite, values)):
            out[metric] = (array("d", later), values)
            continue
        kept = [i for i, value in enumerate(values) if math.isfinite(value)]
        if kept:
            out[metric] = (
                array("d", map(later.__getitem__, kept)),
                array("d", map(values.__getitem__, kept)),
            )
    return out


def _ends(times: array[float], values: array[float]) -> tuple[array[float], array[float]]:
    """The first and the last scrape of a bucket column, in time order: what is kept of it once
    its quantile is made, so the span of the data (where a process lifetime begins when nothing
    else says) stays what it was."""
    if len(times) <= 2:
        return times, values
    first, last = min(times), max(times)
    at_first = times.index(first)
    at_last = len(times) - 1 - times[::-1].index(last)
    return array("d", (first, last)), array("d", (values[at_first], values[at_last]))


def quantiles_from_columns(result: ImportResult, wanted: Collection[str] | None = None) -> list[str]:
    """`quantiles_from_buckets` on a reader's result, before its points are made: each instance's
    quantile columns added and the bucket columns of the family used cut to their ends; the families used."""
    from agent.series.records import sorted_points

    used: set[str] = set()
    for metrics in result.columns.values():
        if any(len(metrics[m][0]) for m in QUANTILE_METRICS.values() if m in metrics):
            continue
        found = _column_families(metrics)
        if not found:
            continue
        family = max(sorted(found), key=lambda name: len(metrics[found[name][math.inf]][0]))
        bounds = found[family]
        made = _aligned_quantiles(bounds, metrics, wanted)
        if made is None:
            points = {bound: sorted_points(*metrics[metric]) for bound, metric in bounds.items()}
            made = {
                metric: (array("d", (ts for ts, _ in series)), array("d", (v for _, v in series)))
                for metric, series in interval_quantiles(points, wanted).items()
            }
        # the first series stays whole: restarts are inferred from it when there is no RSS
        first = next(metric for metric, (times, _) in metrics.items() if times)
        for metric in bounds.values():
            if metric != first:
                metrics[metric] = _ends(*metrics[metric])
        metrics.update(made)
        used.add(family)
    return sorted(used)
