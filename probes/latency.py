"""The `latency` probe: scrape the instance's own `/metrics` and turn its latency histogram into
per-interval quantiles, request rate and error rate.

Each scrape is compared with the previous one of the same process (pid, start time): the bucket
increases between the two give `histogram_quantile` over exactly that interval (`agent.core.quantiles`).
The first scrape of a process, and one after a gap longer than `MAX_GAP`, only sets the baseline.
An interval without requests stores a rate of 0 and no quantiles: "no traffic" is not an error.
The rates are for the detectors; `/metrics` exports `requests_total` and `errors_total` instead,
counters of the increases medic saw, kept per instance so that a restart of the target (its own
counters back to zero) does not reset them.
Instances without `latency.prometheus` in their config get an empty result.

Config (`instances[].latency.prometheus`): `url`, `histogram` (family name), `labels` (only the
series with these label values; summed over the others, like `sum by (le)`), `requests_counter`
(default: the histogram's `_count`), `errors_counter`, `timeout`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from agent.core.errors import ProbeError
from agent.core.quantiles import HistogramSeries, IntervalHistogram, LabelKey, Snapshot, interval_histogram
from agent.core.records import ProbeResult, ProbeTarget, Sample
from probes.base import Schedule

if TYPE_CHECKING:
    from probes.promtext import Exposition, PromSample

MAX_GAP = 600.0  # seconds; an older previous scrape is not compared with (re-baseline instead)
QUANTILE_METRICS = {
    0.5: "latency_p50_seconds",
    0.9: "latency_p90_seconds",
    0.99: "latency_p99_seconds",
    0.999: "latency_p999_seconds",
}
ACCEPT = "text/plain;version=0.0.4;q=0.9,application/openmetrics-text;version=1.0.0;q=0.8,*/*;q=0.1"
SETTING = "latency.prometheus.url"


def latency_settings(target: ProbeTarget, section: str) -> Mapping[str, Any] | None:
    """`latency.<section>` of the target's config as plain data, or None when not configured."""
    latency = target.settings.get("latency") if target.settings else None
    if not isinstance(latency, Mapping):
        return None
    value = latency.get(section)
    return value if isinstance(value, Mapping) else None


@dataclass(frozen=True, slots=True)
class Scrape:
    """What one scrape kept: the selected histogram series and the counters' series."""

    ts: float
    histogram: Snapshot
    requests: dict[LabelKey, float] | None
    errors: dict[LabelKey, float] | None


@dataclass(slots=True)
class RunningTotals:
    """Requests and errors summed over every interval of one instance, for the exported counters."""

    requests: float = 0.0
    errors: float = 0.0


class LatencyProbe:
    name: ClassVar[str] = "latency"
    schedule: ClassVar[Schedule] = "fast"

    def __init__(self) -> None:
        self._client = None
        self._previous: dict[tuple[int, float], Scrape] = {}
        self._totals: dict[str, RunningTotals] = {}
        self._lock = threading.Lock()

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        spec = latency_settings(target, "prometheus")
        if spec is None:
            return ProbeResult()
        scrape = self.scrape(spec, now)
        key = (target.pid, target.start_time)
        with self._lock:
            previous = self._previous.get(key)
            self._previous[key] = scrape
            totals = self._totals.setdefault(target.instance, RunningTotals())
        if previous is None or not 0 < now - previous.ts <= MAX_GAP:
            return ProbeResult()  # the baseline of this process
        return interval_result(target.instance, previous, scrape, now, totals)

    def forget(self, target: ProbeTarget) -> None:
        with self._lock:
            self._previous.pop((target.pid, target.start_time), None)

    def close(self) -> None:
        """Close the kept-alive connections: the agent's probe lives as long as the agent, a test's does not."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def scrape(self, spec: Mapping[str, Any], now: float) -> Scrape:
        """GET the exposition and keep the configured histogram and counters."""
        # the scraper and the parser load on the first scrape: an agent with no latency target
        # (the probe is enabled by default) does not carry them in its RSS
        from probes.scrape import fetch, new_client

        if self._client is None:
            self._client = new_client()
        url = spec["url"]
        reply = fetch(
            self._client,
            "GET",
            url,
            timeout=float(spec.get("timeout", 2.0)),
            setting=SETTING,
            headers={"Accept": ACCEPT},
        )
        if reply.status != 200:
            raise ProbeError(
                f"{url} answered HTTP {reply.status}; check {SETTING} (it should serve /metrics)"
            )
        return read_scrape(reply.body, reply.headers.get("content-type"), spec, now, source=url)


def read_scrape(
    body: bytes | str,
    content_type: str | None,
    spec: Mapping[str, Any],
    now: float,
    source: str = "exposition",
) -> Scrape:
    """Parse one exposition and select what the probe keeps (pure: used by tests and the benchmark)."""
    from probes.promtext import parse_exposition

    histogram = spec["histogram"]
    match = dict(spec.get("labels") or {})
    requests_name, errors_name = spec.get("requests_counter"), spec.get("errors_counter")
    wanted = {histogram, f"{histogram}_bucket", f"{histogram}_count", f"{histogram}_sum"}
    for counter in (requests_name, errors_name):
        if counter:
            wanted |= {counter, counter.removesuffix("_total"), f"{counter}_total"}
    exposition = parse_exposition(body, content_type, families=wanted, source=source)
    snapshot = histogram_snapshot(exposition, histogram, match, source)
    requests = counter_series(exposition, requests_name, match, source) if requests_name else None
    errors = counter_series(exposition, errors_name, match, source) if errors_name else None
    return Scrape(now, snapshot, requests, errors)


def _samples(exposition: Exposition, names: set[str]) -> list[PromSample]:
    """Samples with these names, whichever family they were filed under (text and OpenMetrics differ)."""
    return [s for family in exposition.families.values() for s in family.samples if s.name in names]


def _matches(labels: Mapping[str, str], match: Mapping[str, str], strict: bool) -> bool:
    return all(labels.get(k) == v for k, v in match.items() if strict or k in labels)


def histogram_snapshot(exposition: Exposition, name: str, match: Mapping[str, str], source: str) -> Snapshot:
    """The series of histogram `name` whose labels include `match`, keyed by their labels except `le`."""
    declared = exposition.declared.get(name)
    if declared is not None and declared not in ("histogram", "untyped", "unknown"):
        raise ProbeError(
            f"{source}: {name} is a {declared}, not a histogram; check latency.prometheus.histogram"
        )
    samples = _samples(exposition, {f"{name}_bucket", f"{name}_count", f"{name}_sum"})
    if not samples and declared == "histogram":
        return {}  # declared, but no series yet: a labelled histogram before its first request
    if not samples:
        names = sorted(n for n, t in exposition.declared.items() if t == "histogram")
        hint = f"histograms there: {', '.join(names[:8])}" if names else "it declares no histogram"
        raise ProbeError(
            f"{source}: no histogram {name!r} in the exposition ({hint}); check latency.prometheus.histogram"
        )
    buckets: dict[LabelKey, dict[float, float]] = {}
    counts: dict[LabelKey, float] = {}
    sums: dict[LabelKey, float] = {}
    seen: list[dict[str, str]] = []
    for sample in samples:
        if not _matches(sample.labels, match, strict=True):
            if len(seen) < 3:
                seen.append(sample.labels)
            continue
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
    if not buckets:
        raise ProbeError(
            f"{source}: no series of {name} has the labels {match}; series there look like {seen}; "
            "check latency.prometheus.labels"
        )
    return {key: HistogramSeries(b, counts.get(key), sums.get(key)) for key, b in buckets.items()}


def counter_series(
    exposition: Exposition, name: str, match: Mapping[str, str], source: str
) -> dict[LabelKey, float]:
    """The series of counter `name` (or `name_total`); the label filter applies to labels it has."""
    samples = _samples(exposition, {name} if name.endswith("_total") else {name, f"{name}_total"})
    declared = {exposition.declared.get(n) for n in (name, name.removesuffix("_total"), f"{name}_total")}
    if not samples and "counter" in declared:
        return {}  # declared, but no series yet
    if not samples:
        raise ProbeError(
            f"{source}: no counter {name!r} in the exposition; check the latency.prometheus counters"
        )
    return {
        tuple(sorted(s.labels.items())): s.value for s in samples if _matches(s.labels, match, strict=False)
    }


def counter_increase(earlier: Mapping[LabelKey, float], later: Mapping[LabelKey, float]) -> float:
    """Summed increase of counter series; a series that went down restarted from zero."""
    total = 0.0
    for key, value in later.items():
        before = earlier.get(key, 0.0)
        total += value - before if value >= before else value
    return total


def interval_result(
    instance: str, previous: Scrape, current: Scrape, now: float, totals: RunningTotals | None = None
) -> ProbeResult:
    """The samples of one interval between two scrapes of the same process; with `totals`, the
    interval's requests and errors are added to them and exported as `requests_total`/`errors_total`."""
    result = ProbeResult()
    seconds = current.ts - previous.ts
    interval: IntervalHistogram = interval_histogram(previous.histogram, current.histogram)

    def add(metric: str, value: float) -> None:
        if math.isfinite(value):
            result.samples.append(Sample(instance, metric, now, value))

    if interval.notes:
        result.problems.append(ProbeError(f"histogram cannot give quantiles: {'; '.join(interval.notes)}"))
    elif interval.count > 0:
        for q, metric in QUANTILE_METRICS.items():
            add(metric, interval.quantile(q))
        add("latency_mean_seconds", interval.mean)
    requests = interval.count
    if current.requests is not None and previous.requests is not None:
        requests = counter_increase(previous.requests, current.requests)
    add("request_rate", requests / seconds)
    if totals is not None and math.isfinite(requests):
        totals.requests += requests
        add("requests_total", totals.requests)
    if current.errors is not None and previous.errors is not None:
        errors = counter_increase(previous.errors, current.errors)
        add("error_rate", errors / seconds)
        if requests > 0:
            add("error_ratio", errors / requests)
        if totals is not None and math.isfinite(errors):
            totals.errors += errors
            add("errors_total", totals.errors)
    return result
