"""One guardrail run, start to end: launch, wait until ready, warm up, measure in ABBA rounds,
judge, and stop both servers whatever happened (an error, a crash, Ctrl-C, SIGTERM).

`guard(options, progress)` returns a `Result`; `Result.exit_code` is 0 (no regression) or 1
(a regression). A server that does not start or dies raises `ServerFailed` (exit 3).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent import __version__
from agent.core.errors import MedicError
from agent.guardrail.driver import Driver, round_order
from agent.guardrail.measure import Sampler, scrape_histogram, server_quantiles
from agent.guardrail.options import Options
from agent.guardrail.servers import Servers
from agent.guardrail.verdicts import Measurement, Verdict, judge_all, latency_summary

Progress = Callable[[str, float, float, dict[str, Any]], None]  # phase, done, total, figures


@dataclass(slots=True)
class Result:
    options: Options
    verdicts: list[Verdict]
    measurement: Measurement
    ready_seconds: dict[str, float]
    skipped: int
    notes: list[str] = field(default_factory=list)
    elapsed: float = 0.0

    @property
    def regressions(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.failed]

    @property
    def exit_code(self) -> int:
        return 1 if self.regressions else 0

    def builds(self) -> list[dict[str, Any]]:
        out = []
        for i, name in enumerate(("baseline", "candidate")):
            build = self.measurement.builds[i]
            rss = [v for _, v in build.points("rss_bytes")]
            out.append(
                {
                    "name": name,
                    "latency_seconds": latency_summary(self.measurement.records[i]),
                    "rss_first_bytes": rss[0] if rss else None,
                    "rss_last_bytes": rss[-1] if rss else None,
                    "rss_peak_bytes": max(rss) if rss else None,
                    "allocator": "present"
                    if build.points("allocator_allocated_bytes")
                    else build.allocator or "absent",
                    "problems": build.problems,
                }
            )
        return out

    def to_dict(self) -> dict[str, Any]:
        m = self.measurement
        return {
            "medic": __version__,
            "result": "regression" if self.regressions else "pass",
            "regressions": [v.name for v in self.regressions],
            "exit_code": self.exit_code,
            "verdicts": [v.to_dict() for v in self.verdicts],
            "builds": self.builds(),
            "options": self.options.to_dict(),
            "ready_seconds": self.ready_seconds,
            "rounds": [
                {"start": s, "end": e, "first": "baseline" if f == 0 else "candidate"} for s, e, f in m.rounds
            ],
            "skipped_pairs": self.skipped,
            "elapsed_seconds": self.elapsed,
            "notes": self.notes,
            "series": {
                b.name: {
                    metric: points for metric, points in b.series.items() if metric != "cpu_seconds_total"
                }
                for b in m.builds
            },
            "latency_series": {
                name: [
                    [round(s + m.clock_offset - m.start, 4), round(v, 6), ok]
                    for s, v, ok in zip(r.sent, r.latency, r.ok, strict=True)
                ]
                for name, r in zip(("baseline", "candidate"), m.records, strict=True)
            },
        }


def sample_interval(duration: float) -> float:
    """About 480 samples over the run (20 in each bucket of the detector's long scale), between
    0.1 s and 5 s apart: the lower envelope of a bucket is its smallest sample."""
    return min(5.0, max(0.1, duration / 480))


def guard(options: Options, progress: Progress | None = None) -> Result:
    started = time.monotonic()
    notes: list[str] = []
    with Servers(options.baseline, options.candidate) as servers:
        ready = servers.wait_ready(options.ready_url, options.start_timeout)
        driver = Driver(
            options.requests,
            (servers.baseline.base_url, servers.candidate.base_url),
            rate=options.rate,
            concurrency=options.concurrency,
            timeout=options.timeout,
        )

        def tick(phase: str, phase_start: float, total: float) -> Callable[[], None]:
            def report() -> None:
                servers.check_alive()
                if progress is not None:
                    figures = {
                        name: {"requests": r.count, "errors": r.failures}
                        for name, r in zip(("baseline", "candidate"), driver.active, strict=True)
                    }
                    progress(phase, time.monotonic() - phase_start, total, figures)

            return report

        if options.warmup > 0:
            driver.run(
                options.warmup, 0, record=False, tick=tick("warm-up", time.monotonic(), options.warmup)
            )
            servers.check_alive()
        before = _histograms(servers, options, notes) if options.histogram else None
        sampler = Sampler(servers.both, sample_interval(options.duration), lambda i: driver.records[i].count)
        offset = time.time() - time.monotonic()
        measure_start = time.time()
        sampler.start()
        rounds: list[tuple[float, float, int]] = []
        try:
            per_round = options.duration / options.rounds
            phase_start = time.monotonic()
            for r in range(options.rounds):
                first = round_order(r)
                round_start = time.time()
                driver.run(
                    per_round,
                    first,
                    tick=tick(f"round {r + 1}/{options.rounds}", phase_start, options.duration),
                )
                rounds.append((round_start, time.time(), first))
                servers.check_alive()
        finally:
            sampler.stop()
        measure_end = time.time()
        servers.check_alive()
        if sampler.gone:
            servers.check_alive()
        server_latency: dict[str, dict[str, Any]] = {}
        if before is not None:
            after = _histograms(servers, options, notes)
            for name in before:
                if name in after:
                    server_latency[name] = server_quantiles(before[name], after[name])
    measurement = Measurement(
        measure_start,
        measure_end,
        rounds,
        driver.records,
        offset,
        sampler.builds,
        float(options.limit),
        server_latency,
    )
    verdicts = judge_all(measurement, options.thresholds, options.bootstrap, options.seed)
    for build in sampler.builds:
        if build.allocator:
            notes.append(f"{build.name}: no allocator figures ({build.allocator})")
    if driver.skipped:
        notes.append(
            f"{driver.skipped} request pairs were skipped because every worker was busy: the builds answer "
            "slower than the rate asks; lower --rate or use --concurrency"
        )
    return Result(options, verdicts, measurement, ready, driver.skipped, notes, time.monotonic() - started)


def _histograms(servers: Servers, options: Options, notes: list[str]) -> dict[str, Any]:
    out = {}
    assert options.histogram is not None
    for server in servers.both:
        try:
            out[server.name] = scrape_histogram(
                server, options.metrics_path, options.histogram, options.timeout
            )
        except MedicError as exc:
            if len(notes) < 20:
                notes.append(f"{server.name}: server histogram: {exc}")
    return out
