"""The precision benchmark's cases (`benchmarks.detection.precision` scores them): memory families of
growth that stops and lifetimes cut short, each a healthy twin and a leak twin, and latency fleets
under a fleet-wide daily swing. The families are described in precision.py's module doc."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.detect import InstanceSeries
from agent.detect.slow.rules import Slo
from benchmarks.detection.generate import DAY, HOUR, MINUTE, T0, GiB, deploys

P99 = "latency_p99_seconds"
LATENCY_FAMILIES = ("latency-swing", "latency-queue")
SLO = Slo(quantile=0.99, threshold=0.25, window=5 * MINUTE)


@dataclass
class Case:
    family: str
    noise: str
    seed: int
    leak: bool
    series: list[InstanceSeries]
    onset: float | None = None
    oom: float | None = None
    bad: str | None = None  # the instance that leaks or creeps
    lifetime: float | None = None  # the restart period of a family whose lifetimes are cut short

    @property
    def name(self) -> str:
        return f"{self.family}/{self.noise}/{self.seed}/{'leak' if self.leak else 'healthy'}"


@dataclass
class Workload:
    """The knobs of one memory workload; `floor_at(t, age)` is its healthy floor in bytes."""

    rng: random.Random
    noise: str
    limit: float
    days: float
    level: float  # the settled floor without the family's own growth
    restarts: list[float] = field(default_factory=list)
    restart_floor: float | None = None  # RSS falls to this fraction after a restart (else a cold start)
    growth: Callable[[float, float], float] = lambda _ts, _age: 0.0  # the family's own bytes
    start_series: bool = True  # process_start_time_seconds is scraped

    def build(
        self, name: str, onset: float | None, rate: float, resets: bool = True
    ) -> tuple[InstanceSeries, float | None]:
        """The series, with a leak of `rate` bytes/s from `onset`; (series, OOM time or None)."""
        rng = self.rng
        harsh = self.noise == "harsh"
        season = self.level * rng.uniform(0.05, 0.1) if harsh else self.level * rng.uniform(0.01, 0.04)
        saw = self.level * (rng.uniform(0.06, 0.12) if harsh else rng.uniform(0.02, 0.04))
        saw_period = rng.uniform(3, 10) * MINUTE
        sigma = self.level * (0.012 if harsh else 0.003)
        wander_amp = self.level * (0.012 if harsh else 0.0)
        wander_tau = rng.uniform(4, 8) * HOUR
        bursts = (
            [
                (T0 + rng.uniform(0, self.days * DAY), rng.uniform(10, 40) * MINUTE, rng.uniform(0.05, 0.12))
                for _ in range(int(3 * self.days))
            ]
            if harsh
            else []
        )
        phase = rng.uniform(0, DAY)
        decay = math.exp(-MINUTE / wander_tau)
        wander = 0.0
        warm_tau = rng.uniform(10, 40) * MINUTE
        restarts = sorted(self.restarts)
        life_start, r_i = T0, 0
        rss: list[tuple[float, float]] = []
        starts: list[tuple[float, float]] = []
        oom = None
        for i in range(int(self.days * DAY / MINUTE)):
            ts = T0 + i * MINUTE
            while r_i < len(restarts) and ts >= restarts[r_i]:
                life_start = restarts[r_i]
                r_i += 1
            age = ts - life_start
            traffic = 0.5 + 0.5 * math.sin(2 * math.pi * (ts - phase) / DAY)
            settled = self.level + season * traffic + self.growth(ts, age)
            if self.restart_floor is not None and life_start > T0:
                start_frac = self.restart_floor
                warm = 1 - (1 - start_frac) * math.exp(-age / (3 * HOUR))
            else:
                warm = 1 - 0.35 * math.exp(-age / warm_tau)
            floor = settled * warm
            wander = wander * decay + rng.gauss(0, wander_amp * math.sqrt(1 - decay * decay))
            cycle = ((ts + phase) % saw_period) / saw_period
            value = floor + wander + saw * (0.5 + traffic) * cycle + rng.gauss(0, sigma)
            value += sum(h * self.level for b, d, h in bursts if b <= ts < b + d)
            if onset is not None and ts >= onset:
                value += rate * (ts - (max(onset, life_start) if resets else onset))
            rss.append((ts, round(value)))
            if self.start_series and i % 15 == 0:
                starts.append((ts, life_start))
            if value >= self.limit:
                oom = ts
                break
        series = {"rss_bytes": rss, "memory_limit_bytes": [(T0, self.limit)]}
        if self.start_series:
            series["process_start_time_seconds"] = starts
        return InstanceSeries(name, series), oom


def _workload(rng: random.Random, noise: str, days: tuple[float, float] = (4, 14)) -> Workload:
    limit = rng.uniform(4, 16) * GiB
    return Workload(rng, noise, limit, rng.uniform(*days), limit * rng.uniform(0.4, 0.5))


def _ttl(hours: float) -> Callable[[random.Random, str], Workload]:
    def make(rng: random.Random, noise: str) -> Workload:
        w = _workload(rng, noise)
        w.restarts = deploys(rng, (1.5, 3.5), w.days)
        size = w.limit * rng.uniform(0.80, 0.89) - w.level * 1.15  # the plateau's peaks at 80-89 %
        tau = hours * HOUR / 3  # concave: 95 % full after one TTL
        w.growth = lambda _ts, age: size * (1 - math.exp(-age / tau))
        return w

    return make


def _frag_log(rng: random.Random, noise: str) -> Workload:
    w = _workload(rng, noise)
    w.restarts = deploys(rng, (3, 6), w.days)
    tau0 = rng.uniform(20, 60) * MINUTE
    reach = math.log1p(6 * DAY / tau0)
    size = (w.limit * rng.uniform(0.82, 0.88) - w.level * 1.15) / reach
    w.growth = lambda _ts, age: size * math.log1p(age / tau0)
    return w


def _cache_days(rng: random.Random, noise: str) -> Workload:
    w = _workload(rng, noise, (6, 14))
    tau = rng.uniform(1, 2) * DAY
    size = w.limit * rng.uniform(0.85, 0.9) - w.level * 1.15
    w.growth = lambda _ts, age: size * (1 - math.exp(-age / tau))
    return w


def _traffic_2d(rng: random.Random, noise: str) -> Workload:
    w = _workload(rng, noise, (5, 14))
    launch = T0 + rng.uniform(0.5, 2) * DAY
    rise = w.level * rng.uniform(0.4, 0.6)
    w.growth = lambda ts, _age: rise * min(1.0, max(0.0, (ts - launch) / (2 * DAY)))
    return w


def _restart_20h(rng: random.Random, noise: str) -> Workload:
    w = _workload(rng, noise, (5, 10))
    ts, restarts = T0, []
    while True:
        ts += rng.uniform(17, 23) * HOUR
        if ts >= T0 + w.days * DAY:
            break
        restarts.append(ts)
    w.restarts = restarts
    w.restart_floor = rng.uniform(0.55, 0.65)
    w.start_series = False
    return w


MEMORY_FAMILIES: dict[str, Callable[[random.Random, str], Workload]] = {
    "ttl-6h": _ttl(6),
    "ttl-12h": _ttl(12),
    "frag-log": _frag_log,
    "cache-days": _cache_days,
    "traffic-2d": _traffic_2d,
    "restart-20h": _restart_20h,
}


def memory_cases(family: str, seed: int, noise: str) -> list[Case]:
    """The healthy twin and the leak twin of one workload."""
    make = MEMORY_FAMILIES[family]
    out = []
    for leak in (False, True):
        rng = random.Random(f"precision/{family}/{noise}/{seed}")  # the same workload for both twins
        w = make(rng, noise)
        onset = rate = None
        cut_short = family == "restart-20h"
        if leak:
            leak_rng = random.Random(f"precision/{family}/{noise}/{seed}/leak")
            onset = T0 + leak_rng.uniform(0.5, max(0.6, w.days - 3.5)) * DAY
            if cut_short:  # a lifetime adds 20-35 % of the limit: restarted before it gets there
                rate = w.limit * leak_rng.uniform(0.2, 0.35) / (20 * HOUR)
            else:  # OOM 1-3 days after the onset
                rate = w.limit * leak_rng.uniform(0.45, 0.6) / (leak_rng.uniform(1, 3) * DAY)
        name = f"{family}-{noise}-{seed}-{'leak' if leak else 'ok'}"
        series, oom = w.build(name, onset, rate or 0.0)
        if cut_short:
            series.restarts = None
        out.append(
            Case(
                family,
                noise,
                seed,
                leak,
                [series],
                onset,
                oom,
                name if leak else None,
                20 * HOUR if cut_short else None,
            )
        )
    return out


def latency_cases(seed: int, noise: str, size: int = 12, family: str = "latency-swing") -> list[Case]:
    """A fleet whose p99 swings 2-3× a day together; the leak twin with one pod creeping.

    `latency-swing`: each pod's p99 is its own base times the daily factor, so its ratio to its
    peers holds. `latency-queue`: pods at 0.5-1.4× the fleet's median base latency share a queueing delay that
    follows the traffic, so a fast pod's ratio to its peers rises and falls with the day (from 0.5×
    at night towards 0.8× at the peak) without anything being wrong with it."""
    out = []
    queue = family == "latency-queue"
    key = "latency" if family == "latency-swing" else family  # the seeds' series as first scored
    for creep in (False, True):
        rng = random.Random(f"precision/{key}/{noise}/{seed}")
        swing = rng.uniform(2.0, 3.0)
        phase = rng.uniform(0, DAY)
        days, every = 2.0, 30.0
        sigma = 0.15 if noise == "harsh" else 0.05
        bases = [rng.uniform(0.5, 1.5) if queue else rng.uniform(0.03, 0.06) for _ in range(size)]
        if queue:  # 0.5-1.4× the fleet's median: a pod twice its peers' latency is slow, not healthy
            middle = statistics.median(bases)
            bases = [0.045 * min(1.4, max(0.5, b / middle)) for b in bases]
        typical = statistics.median(bases)
        crng = random.Random(f"precision/{key}/{noise}/{seed}/creep")
        onset = T0 + crng.uniform(0.6, 1.4) * DAY
        rate = crng.uniform(0.25, 0.5)
        series = []
        for i, base in enumerate(bases):
            points = []
            for k in range(int(days * DAY / every)):
                ts = T0 + k * every
                load = 0.5 + 0.5 * math.sin(2 * math.pi * (ts - phase) / DAY)
                daily = base + typical * (swing - 1) * load if queue else base * (1 + (swing - 1) * load)
                value = daily * math.exp(rng.gauss(0, sigma))
                if noise == "harsh" and rng.random() < 1 / 120:
                    value *= rng.uniform(1.5, 3.0)
                if creep and i == 0 and ts >= onset:
                    value *= 1 + rate * (ts - onset) / HOUR
                points.append((ts, value))
            series.append(
                InstanceSeries(f"{family}-{noise}-{seed}-{'creep' if creep else 'ok'}/p{i}", {P99: points})
            )
        out.append(
            Case(
                family,
                noise,
                seed,
                creep,
                series,
                onset if creep else None,
                None,
                series[0].instance if creep else None,
            )
        )
    return out
