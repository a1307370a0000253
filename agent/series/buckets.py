"""Latency quantiles from recorded histogram buckets, as the latency probe makes them online.

A recording may hold a latency histogram's cumulative buckets instead of its quantiles: one series
per bound, named `<family>_bucket{le="<bound>"}` (how the Prometheus reader names `le`-labelled
`_bucket` series; JSON Lines may name them so too). Between two consecutive scrapes the bucket
deltas are the interval's observations, and `histogram_quantile` of them (`agent.core.quantiles`)
is the interval's p50 … p99.9, stored at the later scrape as `latency_p99_seconds` and the others:
the series the slow detector reads. A counter that went down was reset (a new process), so the
interval counts from zero. Instances that already have quantile series keep them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable
from itertools import pairwise

from agent.core.quantiles import bucket_quantile
from agent.detect.latency_rules import QUANTILE_METRICS
from agent.detect.model import InstanceSeries, Points

BUCKET = re.compile(r'^(?P<family>[A-Za-z_:][A-Za-z0-9_:]*)_bucket\{le="(?P<le>[^"]{1,40})"\}$')
MAX_BOUNDS = 64


def parse_bound(text: str) -> float | None:
    """A bucket's upper bound (`0.25`, `+Inf`); None when it is not a number."""
    try:
        bound = float(text)
    except ValueError:
        return None
    return None if math.isnan(bound) or bound < 0 else bound


def families(series: InstanceSeries) -> dict[str, dict[float, Points]]:
    """The histogram families of an instance: family → bound → its cumulative count points."""
    out: dict[str, dict[float, Points]] = {}
    for metric, points in series.series.items():
        match = BUCKET.match(metric)
        bound = parse_bound(match["le"]) if match else None
        if match is None or bound is None or not points:
            continue
        bounds = out.setdefault(match["family"], {})
        if len(bounds) < MAX_BOUNDS:
            bounds[bound] = points
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
