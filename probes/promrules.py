"""The rules of metric families: the types each format declares, the sample names each type allows
beside its bare name, and the OpenMetrics 1.0 rules on one family's samples as the OpenMetrics
project's parser conformance suite states them (the sample names its type allows; counters, `_count`,
`_sum` and buckets neither negative nor NaN; cumulative buckets with a numeric `le` and a `+Inf` one
that equals `_count`; summary quantiles between 0 and 1; info and stateset values; a series'
timestamps not going back). The parser (`probes/promtext.py`) holds every family it keeps from an
OpenMetrics page to them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

from agent.core.errors import ProbeError
from probes.promrecords import MetricFamily

# a number as both formats write it (the parser's, and a `le` or `quantile` label's)
FLOAT = re.compile(
    r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?|[nN][aA][nN])",
    re.ASCII,
)

TEXT_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
OPENMETRICS_TYPES = frozenset(
    {"counter", "gauge", "histogram", "gaugehistogram", "stateset", "info", "summary", "unknown"}
)
# sample-name suffixes each family type allows beside its bare name
SUFFIXES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("_count", "_sum", "_created"),
    "info": ("_info",),
}
ALL_SUFFIXES = tuple(sorted({s for group in SUFFIXES.values() for s in group}, key=len, reverse=True))

# ----------------------------------------------------------------------------- OpenMetrics value rules
_ALLOWED_SAMPLES: dict[str, tuple[str, ...]] = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "unknown": ("",),
}
_NOT_NEGATIVE = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_count"),
    "gaugehistogram": ("_bucket",),
    "summary": ("_count", "_sum"),
}


FailAt = Callable[[int, str, str], ProbeError]


class _Fail:
    """Builds the error for one sample line."""

    def __init__(self, at: list[int], lines: list[str], fail_at: FailAt) -> None:
        self.at, self.lines, self.fail_at = at, lines, fail_at

    def __call__(self, index: int, what: str) -> ProbeError:
        lineno = self.at[index] if index < len(self.at) else 0
        return self.fail_at(lineno, self.lines[lineno - 1] if lineno else "", what)


def check_family(family: MetricFamily, at: list[int], lines: list[str], fail_at: FailAt) -> None:
    """OpenMetrics rules on one family's samples; `at` holds each sample's line number."""
    fail = _Fail(at, lines, fail_at)
    allowed = _ALLOWED_SAMPLES.get(family.type, ("",))
    last_time: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for i, sample in enumerate(family.samples):
        suffix = sample.name[len(family.name) :] if sample.name.startswith(family.name) else None
        if suffix not in allowed:
            shown = ", ".join(family.name + s for s in allowed)
            raise fail(i, f"{sample.name} is not a sample of {family.type} {family.name} (expected {shown})")
        if suffix in _NOT_NEGATIVE.get(family.type, ()) and not sample.value >= 0:
            raise fail(i, f"{sample.name} must be a non-negative number, got {sample.value}")
        if family.type == "info" and sample.value != 1:
            raise fail(i, f"an info sample's value is 1, got {sample.value}")
        if family.type == "stateset":
            if sample.value not in (0, 1):
                raise fail(i, f"a stateset sample's value is 0 or 1, got {sample.value}")
            if family.name not in sample.labels:
                raise fail(i, f"a stateset sample needs the label {family.name!r}")
        if family.type == "summary" and suffix == "":
            quantile = _number_or_none(sample.labels.get("quantile"))
            if quantile is None or not 0 <= quantile <= 1:
                raise fail(
                    i,
                    f"a summary quantile needs a 'quantile' label between 0 and 1, got {sample.labels.get('quantile')!r}",
                )
            if not (sample.value >= 0 or math.isnan(sample.value)):
                raise fail(i, f"a summary quantile's value must not be negative, got {sample.value}")
        if sample.timestamp is not None:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            if sample.timestamp < last_time.get(key, -math.inf):
                raise fail(i, "timestamps of a series must not go back")
            last_time[key] = sample.timestamp
    if family.type in ("histogram", "gaugehistogram"):
        _check_buckets(family, fail)


def _number_or_none(text: str | None) -> float | None:
    if text is None or not FLOAT.fullmatch(text):
        return None
    return float(text)


def _check_buckets(family: MetricFamily, fail: _Fail) -> None:
    """Buckets: a numeric `le`, cumulative counts, a `+Inf` bucket, `_count` equal to it."""
    count_suffix = "_count" if family.type == "histogram" else "_gcount"
    groups: dict[tuple[tuple[str, str], ...], list[tuple[int, float, float]]] = {}
    counts: dict[tuple[tuple[str, str], ...], tuple[int, float]] = {}
    sums: dict[tuple[tuple[str, str], ...], tuple[int, float]] = {}
    sum_suffix = "_sum" if family.type == "histogram" else "_gsum"
    for i, sample in enumerate(family.samples):
        key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
        if sample.name == family.name + "_bucket":
            bound = _number_or_none(sample.labels.get("le"))
            if bound is None or math.isnan(bound):
                raise fail(i, f"a bucket needs a numeric 'le' label, got {sample.labels.get('le')!r}")
            groups.setdefault(key, []).append((i, bound, sample.value))
        elif sample.name == family.name + count_suffix:
            counts[key] = (i, sample.value)
        elif sample.name == family.name + sum_suffix:
            sums[key] = (i, sample.value)
    for key, buckets in groups.items():
        previous_bound, previous_value = -math.inf, 0.0
        for i, bound, value in buckets:
            if bound <= previous_bound:
                raise fail(i, "buckets must be in increasing order of 'le'")
            if value < previous_value:
                raise fail(i, "bucket counts must be cumulative (not decreasing)")
            previous_bound, previous_value = bound, value
        last_index, last_bound, last_value = buckets[-1]
        if last_bound != math.inf:
            raise fail(last_index, 'a histogram needs a bucket with le="+Inf"')
        if key in counts and counts[key][1] != last_value:
            raise fail(
                counts[key][0], f"{family.name}{count_suffix} must equal the +Inf bucket ({last_value})"
            )
    for key, (i, total) in sums.items():
        if total < 0 and not any(bound < 0 for _, bound, _ in groups.get(key, [])):
            raise fail(i, f"a negative {sum_suffix} needs a bucket with a negative 'le'")
    for key, (i, _) in counts.items():
        if key not in groups:
            raise fail(i, f"{family.name}{count_suffix} without buckets")
