"""What one scrape of an instance's `/metrics` holds of its latency: a histogram, a summary, or a
pair of counters (time spent, requests), with the request and error counters beside them.

Servers differ in what they keep: most keep a histogram (`request_latency_seconds_bucket`), MLServer
a summary without quantiles (`model_infer_request_duration_sum`/`_count`), TorchServe and Triton
two counters (`ts_inference_latency_microseconds` and `ts_inference_requests_total`). A histogram
gives interval quantiles; the others give the mean of each interval from the increases of the time
and the count (`rate(sum) / rate(count)`, as their users chart it), and a summary's own quantiles
when it has them. `read_scrape` keeps what the configured source holds; a family of another type,
a missing one or series that cannot be combined is a `ProbeError` or a note that says which setting
to check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.core.errors import ProbeError
from agent.core.quantiles import HistogramSeries, LabelKey, Snapshot

if TYPE_CHECKING:
    from probes.promrecords import Exposition, PromSample

UNITS = {"seconds": 1.0, "milliseconds": 1e-3, "microseconds": 1e-6}  # seconds per unit
_COUNTER_TYPES = (None, "counter", "untyped", "unknown")  # a family without `# TYPE` is untyped


@dataclass(frozen=True, slots=True)
class Scrape:
    """What one scrape kept. A histogram source fills `histogram`; a summary or counters source
    fills `time_sum` and `time_count` (each series' running totals) and, for a summary of one series
    with quantiles, `quantiles`. Figures are in the source's unit: `scale` seconds each."""

    ts: float
    histogram: Snapshot
    requests: dict[LabelKey, float] | None
    errors: dict[LabelKey, float] | None
    time_sum: dict[LabelKey, float] | None = None
    time_count: dict[LabelKey, float] | None = None
    quantiles: dict[float, float] | None = None
    scale: float = 1.0
    notes: tuple[str, ...] = ()  # what could not be kept, for the probe's problems


def read_scrape(
    body: bytes | str,
    content_type: str | None,
    spec: Mapping[str, Any],
    now: float,
    source: str = "exposition",
) -> Scrape:
    """Parse one exposition and select what the probe keeps (pure: used by tests and the benchmark)."""
    from probes.promtext import parse_exposition

    match = dict(spec.get("labels") or {})
    histogram, summary, counters = spec.get("histogram"), spec.get("summary"), spec.get("counters")
    requests_name, errors_name = spec.get("requests_counter"), spec.get("errors_counter")
    wanted: set[str] = set()
    for family in (histogram, summary):
        if family:
            wanted |= {family, f"{family}_bucket", f"{family}_count", f"{family}_sum"}
    for counter in (
        requests_name,
        errors_name,
        *((counters["total"], counters["count"]) if counters else ()),
    ):
        if counter:
            wanted |= {counter, counter.removesuffix("_total"), f"{counter}_total"}
    exposition = parse_exposition(body, content_type, families=wanted, source=source)
    scale = UNITS.get(str(spec.get("unit") or "seconds"), 1.0)
    requests = counter_series(exposition, requests_name, match, source) if requests_name else None
    errors = counter_series(exposition, errors_name, match, source) if errors_name else None
    if histogram:
        snapshot = histogram_snapshot(exposition, histogram, match, source)
        return Scrape(now, snapshot, requests, errors, scale=scale)
    if summary:
        sums, counts, quantiles, notes = summary_series(exposition, summary, match, source)
        return Scrape(now, {}, requests, errors, sums, counts, quantiles, scale, notes)
    if not counters:
        raise ProbeError(f"{source}: latency.prometheus names no histogram, summary or counters")
    total = counter_series(exposition, counters["total"], match, source, "latency.prometheus.counters.total")
    count = counter_series(exposition, counters["count"], match, source, "latency.prometheus.counters.count")
    return Scrape(now, {}, count if requests is None else requests, errors, total, count, None, scale)


def _samples(exposition: Exposition, names: set[str]) -> list[PromSample]:
    """Samples with these names, whichever family they were filed under (text and OpenMetrics differ)."""
    return [s for family in exposition.families.values() for s in family.samples if s.name in names]


def _matches(labels: Mapping[str, str], match: Mapping[str, str], strict: bool) -> bool:
    return all(labels.get(k) == v for k, v in match.items() if strict or k in labels)


def _declared_as(exposition: Exposition, kind: str) -> str:
    names = sorted(n for n, t in exposition.declared.items() if t == kind)
    plural = {"histogram": "histograms", "summary": "summaries"}[kind]
    return f"{plural} there: {', '.join(names[:8])}" if names else f"it declares no {kind}"


def _wrong_type(source: str, name: str, declared: str, wanted: str) -> ProbeError:
    other = {"histogram": "histogram", "summary": "summary", "counter": "counters"}.get(declared)
    hint = f"use latency.prometheus.{other}" if other else "choose another family"
    return ProbeError(
        f"{source}: {name} is a {declared}, not a {wanted}; {hint} (check latency.prometheus.{wanted})"
    )


def _family_samples(
    exposition: Exposition, name: str, kind: str, names: set[str], source: str
) -> list[PromSample]:
    """The samples of family `name`, which must be a `kind` (or untyped); none when it is declared
    but has no series yet (a labelled family before its first request)."""
    declared = exposition.declared.get(name)
    if declared is not None and declared not in (kind, "untyped", "unknown"):
        raise _wrong_type(source, name, declared, kind)
    samples = _samples(exposition, names)
    if not samples and declared != kind:
        raise ProbeError(
            f"{source}: no {kind} {name!r} in the exposition ({_declared_as(exposition, kind)}); "
            f"check latency.prometheus.{kind}"
        )
    return samples


def _selected(
    samples: list[PromSample], name: str, match: Mapping[str, str], source: str
) -> list[PromSample]:
    """The samples whose labels include `match`; a `ProbeError` showing a few others when none do."""
    kept = [s for s in samples if _matches(s.labels, match, strict=True)]
    if samples and not kept:
        seen = [s.labels for s in samples[:3]]
        raise ProbeError(
            f"{source}: no series of {name} has the labels {match}; series there look like {seen}; "
            "check latency.prometheus.labels"
        )
    return kept


def histogram_snapshot(exposition: Exposition, name: str, match: Mapping[str, str], source: str) -> Snapshot:
    """The series of histogram `name` whose labels include `match`, keyed by their labels except `le`."""
    names = {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
    samples = _selected(_family_samples(exposition, name, "histogram", names, source), name, match, source)
    buckets: dict[LabelKey, dict[float, float]] = {}
    counts: dict[LabelKey, float] = {}
    sums: dict[LabelKey, float] = {}
    for sample in samples:
        if sample.name.endswith("_bucket"):
            le = sample.labels.get("le")
            try:
                bound = float(le) if le is not None else math.nan
            except ValueError:
                bound = math.nan
            if math.isnan(bound):
                raise ProbeError(f"{source}: a bucket of {name} has no valid 'le' label (got {le!r})")
            key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "le"))
            buckets.setdefault(key, {})[bound] = sample.value
        else:
            key = tuple(sorted(sample.labels.items()))
            (counts if sample.name.endswith("_count") else sums)[key] = sample.value
    if samples and not buckets:
        raise ProbeError(f"{source}: no series of {name} has buckets; check latency.prometheus.histogram")
    return {key: HistogramSeries(b, counts.get(key), sums.get(key)) for key, b in buckets.items()}


def summary_series(
    exposition: Exposition, name: str, match: Mapping[str, str], source: str
) -> tuple[dict[LabelKey, float], dict[LabelKey, float], dict[float, float] | None, tuple[str, ...]]:
    """The `_sum` and `_count` of summary `name`'s series whose labels include `match`, and the
    quantiles of its one selected series (a summary's quantiles are its client's own, over its own
    window: those of several series cannot be combined, so they are kept only for one)."""
    names = {name, f"{name}_sum", f"{name}_count"}
    samples = _selected(_family_samples(exposition, name, "summary", names, source), name, match, source)
    sums: dict[LabelKey, float] = {}
    counts: dict[LabelKey, float] = {}
    quantiles: dict[LabelKey, dict[float, float]] = {}
    for sample in samples:
        if sample.name == name:
            key = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "quantile"))
            try:
                q = float(sample.labels.get("quantile", "nan"))
            except ValueError:
                q = math.nan
            if not 0.0 <= q <= 1.0:
                raise ProbeError(
                    f"{source}: a quantile series of {name} has no valid 'quantile' label "
                    f"(got {sample.labels.get('quantile')!r})"
                )
            if math.isfinite(sample.value):  # NaN: no observation in the client's window
                quantiles.setdefault(key, {})[q] = sample.value
        else:
            key = tuple(sorted(sample.labels.items()))
            (counts if sample.name.endswith("_count") else sums)[key] = sample.value
    if set(sums) != set(counts):
        odd = sorted(set(sums) ^ set(counts))[0]
        raise ProbeError(
            f"{source}: the series {dict(odd)} of summary {name} lacks its _sum or its _count; "
            "a summary needs both (check latency.prometheus.summary)"
        )
    notes: tuple[str, ...] = ()
    kept = None
    if len(quantiles) == 1:
        kept = next(iter(quantiles.values()))
    elif quantiles:
        notes = (
            f"the quantiles of {len(quantiles)} series of {name} cannot be combined into one: "
            "only the mean is kept; narrow latency.prometheus.labels to one series for its quantiles",
        )
    return sums, counts, kept, notes


def counter_series(
    exposition: Exposition,
    name: str,
    match: Mapping[str, str],
    source: str,
    setting: str = "the latency.prometheus counters",
) -> dict[LabelKey, float]:
    """The series of counter `name` (or `name_total`); the label filter applies to labels it has."""
    samples = _samples(exposition, {name} if name.endswith("_total") else {name, f"{name}_total"})
    declared = {exposition.declared.get(n) for n in (name, name.removesuffix("_total"), f"{name}_total")}
    wrong = sorted(t for t in declared if t not in _COUNTER_TYPES)
    if wrong:
        raise ProbeError(
            f"{source}: {name} is a {wrong[0]}, not a counter: medic needs a running total that only "
            f"grows; check {setting}"
        )
    if not samples and "counter" in declared:
        return {}  # declared, but no series yet
    if not samples:
        raise ProbeError(f"{source}: no counter {name!r} in the exposition; check {setting}")
    return {
        tuple(sorted(s.labels.items())): s.value for s in samples if _matches(s.labels, match, strict=False)
    }
