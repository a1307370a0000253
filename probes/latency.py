"""The `latency` probe: scrape the instance's own `/metrics` and turn its latency source into
per-interval figures, request rate and error rate.

Each scrape is compared with the previous one of the same process (pid, start time). From a
histogram, the bucket increases between the two give `histogram_quantile` over exactly that
interval (`agent.core.quantiles`) and the mean; from a summary or a pair of counters (time spent,
requests: `probes.latency_source`), the increases give the interval's mean, stored as
`latency_mean_seconds` and never as a quantile, and a summary's own quantiles are stored as they are.
The first scrape of a process, and one after a gap longer than `MAX_GAP`, only sets the baseline.
An interval without requests stores a rate of 0 and no quantiles: "no traffic" is not an error.
The rates are for the detectors; `/metrics` exports `requests_total` and `errors_total` instead,
counters of the increases medic saw, kept per instance so that a restart of the target (its own
counters back to zero) does not reset them.
Instances without `latency.prometheus` in their config get an empty result.

Config (`instances[].latency.prometheus`): `url`, one of `histogram`, `summary` (family names) or
`counters` (`total`, `count`), `unit` of their figures, `labels` (only the series with these label
values; summed over the others, like `sum by (le)`), `requests_counter` (default: the source's own
count), `errors_counter`, `timeout`.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from agent.core.errors import ProbeError
from agent.core.quantiles import LabelKey, interval_histogram
from agent.core.records import ProbeResult, ProbeTarget, Sample
from probes.base import Schedule
from probes.latency_source import Scrape, read_scrape

if TYPE_CHECKING:
    import httpx  # loads with the first scrape (probes.scrape), not with the probe

__all__ = ["QUANTILE_METRICS", "LatencyProbe", "Scrape", "interval_result", "latency_settings", "read_scrape"]

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


@dataclass(slots=True)
class RunningTotals:
    """Requests and errors summed over every interval of one instance, for the exported counters."""

    requests: float = 0.0
    errors: float = 0.0


class LatencyProbe:
    name: ClassVar[str] = "latency"
    schedule: ClassVar[Schedule] = "fast"

    def __init__(self) -> None:
        self._client: httpx.Client | None = None  # made by the first scrape
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
    scale = current.scale

    def add(metric: str, value: float) -> None:
        if math.isfinite(value):
            result.samples.append(Sample(instance, metric, now, value))

    result.problems.extend(ProbeError(note) for note in current.notes)
    if current.time_sum is None or current.time_count is None:  # a histogram
        interval = interval_histogram(previous.histogram, current.histogram)
        count = interval.count
        if interval.notes:
            result.problems.append(
                ProbeError(f"histogram cannot give quantiles: {'; '.join(interval.notes)}")
            )
        elif count > 0:
            for q, metric in QUANTILE_METRICS.items():
                add(metric, interval.quantile(q) * scale)
            add("latency_mean_seconds", interval.mean * scale)
    else:  # a summary or a pair of counters: the mean, and a summary's own quantiles
        count = counter_increase(previous.time_count or {}, current.time_count)
        spent = counter_increase(previous.time_sum or {}, current.time_sum)
        if count > 0:
            mean = spent / count * scale
            if math.isfinite(mean) and mean >= 0:
                add("latency_mean_seconds", mean)
            else:
                result.problems.append(
                    ProbeError(
                        f"no mean latency: {spent:g} spent on {count:g} requests (NaN or a negative figure)"
                    )
                )
            for q, value in (current.quantiles or {}).items():
                if q in QUANTILE_METRICS:
                    add(QUANTILE_METRICS[q], value * scale)
    requests = count
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
