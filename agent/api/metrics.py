"""`/metrics`: a snapshot of what the probes last saw, never a probe run at scrape time.

Per-instance figures come from `agent.core.catalog` as `medic_<metric>{name="<instance>"}` (latency
quantiles as one family with a `quantile` label); the agent's own health (probe durations and
errors, instance status) sits beside them, and its own process as the standard `process_*`. A scrape
gets OpenMetrics when it asks for it (as Prometheus does), else the text format, gzipped when
the scraper accepts gzip.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import Collector

from agent import __version__
from agent.core.catalog import ExportedFamily, exported_families, exported_sample
from agent.watch.tracker import Tracker

_PROBE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class InstanceCollector(Collector):
    """Turns the tracker's instance states into metric families at scrape time."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker = tracker

    def collect(self) -> Iterator[Metric]:
        with self.tracker.lock:
            states = sorted(self.tracker.states.values(), key=lambda s: s.name)
            up = GaugeMetricFamily(
                "medic_instance_up", "1 if the instance's process runs, else 0.", labels=["name"]
            )
            info = InfoMetricFamily("medic_instance", "The process an instance follows.", labels=["name"])
            restarts = CounterMetricFamily(
                "medic_instance_restarts", "Restarts seen (new pid or start time).", labels=["name"]
            )
            start = GaugeMetricFamily(
                "medic_instance_start_time_seconds", "Start time of the followed process.", labels=["name"]
            )
            last_probe = GaugeMetricFamily(
                "medic_instance_last_probe_timestamp_seconds",
                "When the instance was last probed.",
                labels=["name"],
            )
            errors = CounterMetricFamily(
                "medic_probe_errors", "Probe failures, partial ones included.", labels=["probe", "name"]
            )
            success = GaugeMetricFamily(
                "medic_probe_last_success_timestamp_seconds",
                "When the probe last read the instance.",
                labels=["probe", "name"],
            )
            families = {family.name: _family(family) for family in exported_families().values()}
            for state in states:
                labels = [state.name]
                up.add_metric(labels, 1.0 if state.status == "up" else 0.0)
                # no pid: a label that changes on every restart makes a new series each time
                info.add_metric(
                    labels,
                    {
                        "status": state.status,
                        "mode": "managed" if state.spec.match.managed else "attached",
                        "limit_source": state.memory_limit_source or "",
                        **{k: v for k, v in state.labels.items() if k not in ("name",)},
                    },
                )
                restarts.add_metric(labels, state.restarts)
                if state.start_time and state.status == "up":
                    start.add_metric(labels, state.start_time)
                if state.last_probe:
                    last_probe.add_metric(labels, state.last_probe)
                for probe, health in sorted(state.probes.items()):
                    errors.add_metric([probe, state.name], health.errors_total)
                    if health.last_success:
                        success.add_metric([probe, state.name], health.last_success)
                if state.status != "up":
                    continue
                for metric, value in state.latest.items():
                    exported = exported_sample(metric)
                    if exported is None:
                        continue
                    family_name, extra = exported
                    family = families[family_name]
                    if extra:  # a quantile of a summary: a sample of the family's own name
                        family.add_sample(family_name, {"name": state.name, extra[0]: extra[1]}, value)
                    else:
                        family.add_metric(labels, value)
        yield from (up, info, restarts, start, last_probe, errors, success)
        yield from (family for family in families.values() if family.samples)


def _family(family: ExportedFamily) -> Metric:
    """An empty metric family of the catalog, labelled by instance `name`."""
    if family.kind == "summary":
        return Metric(family.name, family.help, "summary")
    kind = CounterMetricFamily if family.kind == "counter" else GaugeMetricFamily
    return kind(family.name, family.help, labels=["name"])


class FindingCollector(Collector):
    """Open findings, and the slope and time-to-OOM of memory findings, for alert rules."""

    def __init__(self, detection) -> None:
        self.detection = detection

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
        for finding in self.detection.open_findings():
            key = (finding.instance, finding.kind, finding.severity)
            counts[key] = counts.get(key, 0) + 1
            evidence = finding.evidence
            if finding.kind == "leak" and isinstance(evidence.get("slope_bytes_per_second"), (int, float)):
                slope.add_metric([finding.instance], evidence["slope_bytes_per_second"])
            value = evidence.get("time_to_oom_seconds")
            if finding.kind in ("leak", "oom-risk") and isinstance(value, (int, float)) and value == value:
                soonest[finding.instance] = min(value, soonest.get(finding.instance, float("inf")))
        for key, count in sorted(counts.items()):
            findings.add_metric(list(key), count)
        for name, value in sorted(soonest.items()):
            ttoom.add_metric([name], value)
        yield from (findings, slope, ttoom)


class Telemetry:
    """The agent's registry: instance snapshot, probe timings and the agent's own process
    (`process_*`, the names every client library's process collector exports)."""

    def __init__(self, tracker: Tracker) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(InstanceCollector(tracker))
        ProcessCollector(registry=self.registry)
        self.probe_duration = Histogram(
            "medic_probe_duration_seconds",
            "Wall time of one probe run on one instance.",
            labelnames=["probe"],
            buckets=_PROBE_BUCKETS,
            registry=self.registry,
        )
        self.job_skipped_runs = Counter(
            "medic_job_skipped_runs_total",
            "Scheduled runs of a job skipped because its previous run was still going (a slow dependency).",
            labelnames=["job"],
            registry=self.registry,
        )
        build = InfoMetricFamily("medic_build", "medic's version.")
        build.add_metric([], {"version": __version__})
        self.registry.register(_Static([build]))

    def watch_findings(self, detection) -> None:
        """Export the open findings of `detection` (an `agent.jobs.detection.Detection`)."""
        self.registry.register(FindingCollector(detection))

    def count_skipped_run(self, job: str) -> None:
        self.job_skipped_runs.labels(job).inc()

    def observe_probe(self, probe: str, seconds: float, ok: bool) -> None:
        self.probe_duration.labels(probe).observe(seconds)


def render(registry: CollectorRegistry, accept: str, accept_encoding: str) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a scrape: prometheus_client's own negotiation, so the agent answers
    exactly as any client-library exporter would."""
    encoder, content_type = choose_encoder(accept)
    body = encoder(registry)
    headers = {"Content-Type": content_type, "Vary": "Accept, Accept-Encoding"}
    if gzip_accepted(accept_encoding):
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    return body, headers


class _Static(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)
