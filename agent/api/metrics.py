"""`/metrics`: a snapshot of what the probes last saw, never a probe run at scrape time.

Per-instance figures come from `agent.core.catalog` as `medic_<metric>{name="<instance>"}` (latency
quantiles as one family with a `quantile` label); the agent's own health (probe durations and
errors, instance status) sits beside them, and its own process as the standard `process_*`. A scrape
gets OpenMetrics when it asks for it (as Prometheus does), else the text format, gzipped when
the scraper accepts gzip.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from agent import __version__
from agent.api.exposition import Families, PageEncoder, Rows
from agent.api.snapshots import TickCache, Ticks
from agent.config.model import InstanceSpec
from agent.core.catalog import CATALOG, ExportedFamily, exported_families, exported_sample
from agent.detect.lifecycle import earlier_process
from agent.jobs.detection import Detection
from agent.watch.tracker import Tracker

MAX_VARIANTS = 4  # pages (and encoders) kept at once: Prometheus asks for one, a person's curl another
_PROBE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class _Seen(NamedTuple):
    """One instance as a scrape sees it: copied under the tracker's lock, so every family of the
    scrape tells of the same moment."""

    name: str
    status: str
    spec: InstanceSpec
    limit_source: str | None
    restarts: int
    last_probe: float | None
    # (probe, errors_total, last_success), by probe: the probes that read figures of the instance or
    # failed on it; one with nothing to read here (no latency source, not a JVM) has no health to tell
    probes: list[tuple[str, int, float | None]]
    latest: dict[str, float]  # empty unless the instance is up


class InstanceCollector(Collector):
    """Turns the tracker's instance states into metric families at scrape time, one family at a
    time: a page of 50 instances holds ~2800 samples, and building them all before any is encoded
    was the scrape's peak (0.9 MiB of objects)."""

    def __init__(self, tracker: Tracker, fleet_label: str = "fleet") -> None:
        self.tracker = tracker
        self.fleet_label = fleet_label

    def collect(self) -> Iterator[Metric]:
        # the process's start time is `medic_process_start_time_seconds` (the catalog's), so it is not
        # repeated here as `medic_instance_start_time_seconds` (docs/metrics.md, "Dropped")
        with self.tracker.lock:
            seen = [
                _Seen(
                    state.name,
                    state.status,
                    state.spec,
                    state.memory_limit_source,
                    state.restarts,
                    state.last_probe,
                    [
                        (probe, h.errors_total, h.last_success)
                        for probe, h in sorted(state.probes.items())
                        if h.has_figures or h.errors_total
                    ],
                    dict(state.latest) if state.status == "up" else {},
                )
                for state in sorted(self.tracker.states.values(), key=lambda s: s.name)
            ]
        # each family is built when the encoder asks for it, and dropped once encoded
        yield Rows(
            "medic_instance_up",
            "1 if the instance's process runs, else 0.",
            "gauge",
            rows=(((s.name,), 1.0 if s.status == "up" else 0.0) for s in seen),
        )
        yield _instance_info(seen, self.fleet_label)
        yield Rows(
            "medic_instance_restarts",
            "Restarts seen (new pid or start time).",
            "counter",
            rows=(((s.name,), s.restarts) for s in seen),
        )
        yield Rows(
            "medic_instance_last_probe_timestamp_seconds",
            "When the instance was last probed.",
            "gauge",
            rows=(((s.name,), s.last_probe) for s in seen if s.last_probe),
        )
        yield Rows(
            "medic_probe_errors",
            "Probe failures, partial ones included.",
            "counter",
            ("probe", "name"),
            (((probe, s.name), errors) for s in seen for probe, errors, _ in s.probes),
        )
        yield Rows(
            "medic_probe_last_success_timestamp_seconds",
            "When the probe last read the instance.",
            "gauge",
            ("probe", "name"),
            (((probe, s.name), success) for s in seen for probe, _, success in s.probes if success),
        )
        for family, metrics in _catalog_families():
            metric = _catalog_family(family, metrics, seen)
            if metric.rows:
                yield metric


def _instance_info(seen: list[_Seen], fleet_label: str) -> Metric:
    info = InfoMetricFamily("medic_instance", "The process an instance follows.", labels=["name"])
    for s in seen:
        labels = {k: v for k, v in s.spec.labels.items() if k != "name"}
        if fleet_label in s.spec.labels:  # `fleet`, whatever label names it: the rules' alerts read it here
            labels["fleet"] = s.spec.labels[fleet_label]
        # no pid: a label that changes on every restart makes a new series each time
        info.add_metric(
            [s.name],
            {
                "status": s.status,
                "mode": "managed" if s.spec.match.managed else "attached",
                "limit_source": s.limit_source or "",
                **labels,
            },
        )
    return info


@cache
def _catalog_families() -> tuple[tuple[ExportedFamily, tuple[tuple[str, tuple[str, str] | None], ...]], ...]:
    """Each family of the catalog with the stored metrics it exports and their extra label, in the
    catalog's order."""
    members: dict[str, list[tuple[str, tuple[str, str] | None]]] = {}
    for metric in CATALOG:
        exported = exported_sample(metric)
        if exported is not None:
            members.setdefault(exported[0], []).append((metric, exported[1]))
    return tuple(
        (family, tuple(members[name])) for name, family in exported_families().items() if name in members
    )


def _catalog_family(
    family: ExportedFamily, metrics: tuple[tuple[str, tuple[str, str] | None], ...], seen: list[_Seen]
) -> Rows:
    """One family of the catalog over every instance that is up, labelled by instance `name` (and,
    for the quantiles of a summary, by the family's extra label)."""
    extra_label = family.extra_label if family.kind == "summary" else None
    rows = Rows(family.name, family.help, family.kind, ("name", extra_label) if extra_label else ("name",))
    add = rows.rows.append
    for s in seen:
        latest = s.latest
        for stored, extra in metrics:
            value = latest.get(stored)
            if value is None:
                continue
            if extra_label is None:
                add(((s.name,), value))
            elif extra is not None and extra[0] == extra_label:  # a quantile: a sample of the family's name
                add(((s.name, extra[1]), value))
    return rows


class FindingCollector(Collector):
    """Open findings, and the slope and time-to-OOM of memory findings, for alert rules.

    A time to OOM is exported only while its instance runs the process it was measured on, and only
    when it is known: after a restart (or while the instance is down) it is unknown until the new
    process is measured, and the series is absent, so `medic_time_to_oom_seconds < X` cannot fire
    on it; past a limit set only in medic's config it is unknown too (`agent.detect.memory.oom`)."""

    def __init__(self, detection: Detection, tracker: Tracker) -> None:
        self.detection = detection
        self.tracker = tracker

    def _running(self) -> dict[str, float]:
        """The start time of the process each instance that is up runs now."""
        with self.tracker.lock:
            return {
                s.name: s.start_time
                for s in self.tracker.states.values()
                if s.status == "up" and s.start_time is not None
            }

    def collect(self) -> Iterator[Metric]:
        findings = GaugeMetricFamily(
            "medic_findings",
            "Open findings by instance, kind and severity.",
            labels=["name", "kind", "severity"],
        )
        slope = GaugeMetricFamily(
            "medic_leak_slope_bytes_per_second",
            "Growth of the leaking series, open leak findings.",
            labels=["name"],
        )
        ttoom = GaugeMetricFamily(
            "medic_time_to_oom_seconds",
            "Projected time to the memory limit (open leak/oom-risk).",
            labels=["name"],
        )
        counts: dict[tuple[str, str, str], int] = {}
        soonest: dict[str, float] = {}
        running = self._running()
        for finding in self.detection.open_findings():
            key = (finding.instance, finding.kind, finding.severity)
            counts[key] = counts.get(key, 0) + 1
            evidence = finding.evidence
            if finding.kind == "leak" and isinstance(evidence.get("slope_bytes_per_second"), (int, float)):
                slope.add_metric([finding.instance], evidence["slope_bytes_per_second"])
            value = evidence.get("time_to_oom_seconds")
            measured = finding.instance in running and not earlier_process(
                finding.instance, finding.lifetime_start, running
            )
            if (
                finding.kind in ("leak", "oom-risk")
                and measured
                and isinstance(value, (int, float))
                and value == value
            ):
                soonest[finding.instance] = min(value, soonest.get(finding.instance, float("inf")))
        for labels, count in sorted(counts.items()):
            findings.add_metric(list(labels), count)
        for name, value in sorted(soonest.items()):
            ttoom.add_metric([name], value)
        yield from (findings, slope, ttoom)


class Telemetry:
    """The agent's registry: instance snapshot, probe timings and the agent's own process
    (`process_*`, the names every client library's process collector exports)."""

    def __init__(
        self, tracker: Tracker, *, agent: str | None = None, fleet_label: str = "fleet", max_age: float = 1.0
    ) -> None:
        """`max_age`: how long a page is served before it is built again even without a new tick."""
        self.registry = CollectorRegistry(auto_describe=False)
        self.tracker = tracker
        self.registry.register(InstanceCollector(tracker, fleet_label))
        ProcessCollector(registry=self.registry)
        self.probe_duration = Histogram(
            "medic_probe_duration_seconds",
            "Wall time of one probe run on one instance.",
            labelnames=["probe"],
            buckets=_PROBE_BUCKETS,
            registry=self.registry,
        )
        self._probe_durations: dict[str, Histogram] = {}
        self.job_skipped_runs = Counter(
            "medic_job_skipped_runs_total",
            "Scheduled runs of a job skipped because its previous run was still going (a slow dependency).",
            labelnames=["job"],
            registry=self.registry,
        )
        # `agent`: the name alerts give this agent; the shipped rules read it here for theirs
        build = InfoMetricFamily("medic_build", "medic's version, and the agent's name in alerts.")
        build.add_metric([], {"version": __version__, **({"agent": agent} if agent else {})})
        self.registry.register(Families([build]))
        self.ticks = Ticks()
        self.max_age = max_age
        self.pages = Pages(self.registry, self.ticks, max_age)

    def watch_findings(self, detection: Detection) -> None:
        """Export the open findings of `detection`."""
        self.registry.register(FindingCollector(detection, self.tracker))

    def changed(self) -> None:
        """What the page shows changed (a probe tick, a reconcile, a detection run): the next scrape
        builds it anew, and so does `/api/v1/instances`."""
        self.ticks.changed()

    def count_skipped_run(self, job: str) -> None:
        self.job_skipped_runs.labels(job).inc()

    def observe_probe(self, probe: str, seconds: float, ok: bool) -> None:
        child = self._probe_durations.get(probe)
        if child is None:  # `labels()` validates and locks on every call: a child per probe, kept
            child = self._probe_durations[probe] = self.probe_duration.labels(probe)
        child.observe(seconds)


def render(registry: Collector, accept: str, accept_encoding: str) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a scrape of `registry` built afresh: prometheus_client's own
    negotiation, and the page byte for byte as its encoders write it (agent/api/exposition.py)."""
    encoder, content_type = choose_encoder(accept)
    compressed = gzip_accepted(accept_encoding)
    return PageEncoder(encoder).page(registry.collect(), compressed), _headers(content_type, compressed)


def _headers(content_type: str, compressed: bool) -> dict[str, str]:
    headers = {"Content-Type": content_type, "Vary": "Accept, Accept-Encoding"}
    if compressed:
        headers["Content-Encoding"] = "gzip"
    return headers


class Pages:
    """The page of each variant a scraper asks for (format and gzip), built when first asked after
    a tick and then served as bytes to every scraper (agent/api/snapshots.py): the samples change
    once per probe tick, and a variant nobody scrapes is never built."""

    def __init__(self, registry: Collector, ticks: Ticks, max_age: float) -> None:
        self.registry = registry
        self._pages: TickCache[bytes] = TickCache(ticks, max_age, MAX_VARIANTS)
        self._encoders: dict[str, PageEncoder] = {}  # by content type, the ones of the pages kept

    def peek(self, accept: str, accept_encoding: str) -> tuple[bytes, dict[str, str]] | None:
        """`get`'s answer if this tick's page is built, else None: what the event loop may ask."""
        _, content_type = choose_encoder(accept)
        compressed = gzip_accepted(accept_encoding)
        body = self._pages.peek((content_type, compressed))
        return None if body is None else (body, _headers(content_type, compressed))

    def get(self, accept: str, accept_encoding: str) -> tuple[bytes, dict[str, str]]:
        """The body and headers of a scrape that sent these Accept and Accept-Encoding headers."""
        encoder, content_type = choose_encoder(accept)
        compressed = gzip_accepted(accept_encoding)

        def build() -> bytes:
            page_encoder = self._encoders.pop(content_type, None) or PageEncoder(encoder)
            self._encoders[content_type] = page_encoder
            while len(self._encoders) > MAX_VARIANTS:
                del self._encoders[next(iter(self._encoders))]
            return page_encoder.page(self.registry.collect(), compressed)

        return self._pages.get((content_type, compressed), build), _headers(content_type, compressed)
