"""Both builds measured with medic's own probes, side by side, on one clock.

Every `interval` the sampler runs the `process` probe (RSS, CPU seconds) and, where the build has
medic's allocator hook or LD_PRELOAD shim, the `allocator` probe on both builds with one
timestamp, and notes how many requests each had answered by then, for CPU seconds per request
over each interval. A build whose process is gone raises `ServerFailed` on the main thread at
the next check. With `histogram`, the builds' own `/metrics` histogram is read at the start and
the end of the measurement (`probes.latency.read_scrape`) for the server-side quantiles.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agent.core.errors import MedicError, ProbeError, ProbeUnavailable
from agent.core.quantiles import interval_histogram
from agent.core.records import ProbeTarget
from agent.guardrail.servers import Server
from probes.allocator import AllocatorProbe
from probes.latency import QUANTILE_METRICS, Scrape, read_scrape
from probes.process import ProcessProbe
from probes.scrape import fetch, new_client

KEPT = ("rss_bytes", "cpu_seconds_total", "allocator_allocated_bytes", "allocator_resident_bytes")
MAX_POINTS = 20_000


@dataclass(slots=True)
class BuildSeries:
    """One build's samples: metric -> [(unix ts, value)], and requests answered at each sample."""

    name: str
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    answered: list[tuple[float, int]] = field(default_factory=list)
    allocator: str | None = None  # why there are no allocator figures, when there are none
    problems: list[str] = field(default_factory=list)

    def points(self, metric: str) -> list[tuple[float, float]]:
        return self.series.get(metric, [])

    def add(self, metric: str, ts: float, value: float) -> None:
        points = self.series.setdefault(metric, [])
        if len(points) < MAX_POINTS:
            points.append((ts, value))


class Sampler:
    """Samples both builds every `interval` seconds in a thread, from `start()` to `stop()`."""

    def __init__(
        self, servers: tuple[Server, Server], interval: float, answered: Callable[[int], int]
    ) -> None:
        self.servers = servers
        self.interval = interval
        self.answered = answered
        self.builds = (BuildSeries(servers[0].name), BuildSeries(servers[1].name))
        self.process = ProcessProbe()
        self.allocator = AllocatorProbe(timeout=1.0)
        self._hooked = [True, True]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.gone: list[str] = []

    def targets(self) -> list[ProbeTarget]:
        return [ProbeTarget(s.name, s.pid, s.start_time) for s in self.servers]

    def sample_once(self) -> None:
        now = time.time()
        for i, (server, target) in enumerate(zip(self.servers, self.targets(), strict=True)):
            build = self.builds[i]
            try:
                result = self.process.collect(target, now)
            except MedicError:
                if server.name not in self.gone:
                    self.gone.append(server.name)
                continue
            for sample in result.samples:
                if sample.metric in KEPT:
                    build.add(sample.metric, now, sample.value)
            build.answered.append((now, self.answered(i)))
            if self._hooked[i]:
                self._allocator(i, target, now)

    def _allocator(self, i: int, target: ProbeTarget, now: float) -> None:
        build = self.builds[i]
        try:
            result = self.allocator.collect(target, now)
        except ProbeUnavailable as exc:
            self._hooked[i] = False
            build.allocator = str(exc)
            return
        except ProbeError as exc:
            if len(build.problems) < 10:
                build.problems.append(f"allocator: {exc}")
            return
        for sample in result.samples:
            if sample.metric in KEPT:
                build.add(sample.metric, now, sample.value)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample_once()

    def start(self) -> None:
        self.sample_once()
        self._thread = threading.Thread(target=self._loop, name="guardrail-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval + 5)
        self.sample_once()


def scrape_histogram(server: Server, path: str, histogram: str, timeout: float) -> Scrape | None:
    """The build's own histogram now, or None (the reason is left to the caller's notes)."""
    url = server.base_url.rstrip("/") + path
    with new_client() as client:
        reply = fetch(client, "GET", url, timeout=timeout, setting="--metrics-path")
    if reply.status != 200:
        raise ProbeError(f"{url} answered HTTP {reply.status}")
    return read_scrape(
        reply.body, reply.headers.get("content-type"), {"histogram": histogram}, time.time(), url
    )


def server_quantiles(before: Scrape, after: Scrape) -> dict[str, Any]:
    """p50/p90/p99 of the server's own histogram over the measurement (bucket interpolation)."""
    interval = interval_histogram(before.histogram, after.histogram)
    if interval.notes or interval.count <= 0:
        return {"requests": interval.count, "notes": list(interval.notes)}
    out: dict[str, Any] = {"requests": interval.count}
    for q in (0.5, 0.9, 0.99):
        out[QUANTILE_METRICS[q].removeprefix("latency_").removesuffix("_seconds")] = interval.quantile(q)
    return out
