"""Seeded fleets of fresh processes after a deploy: the case where a detector has no history.

Every rollout starts new processes (in Kubernetes new pod names, an empty state_dir), and a new
build is exactly when leaks arrive. Each family is a fleet of 5 to 20 instances sharing one
daily traffic cycle (±8 %), each with its own level, GC sawtooth, noise and warm-up, all started
at the deploy. `prior` says what medic knows of the workload when the new processes start:

- `none`: a lone new fleet, nothing before the deploy;
- `history`: a week of samples of the previous build under the same instance names (earlier
  lifetimes in the store);
- `peers`: the previous build ran under other names (pods of the old ReplicaSet): its week is
  what the coordinator's fleet view or a Prometheus pull would give, passed as priors only.

Leak fleets leak linearly from the deploy in most instances (the healthy rest stay flat), each
leaking instance reaching its limit 12, 24, 36 or 60 h after the deploy. Healthy fleets: a deep
warm-up, a cache filling for a day, traffic growing after a launch (with `requests_total`), and
a plain daily cycle. Fleet traces end 3.5 days after the deploy or at their OOM.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from benchmarks.detection.generate import DAY, HOUR, MINUTE, T0, GiB, Trace

HISTORY_DAYS = 7
AFTER_DAYS = 3.5
DEPLOY = T0 + HISTORY_DAYS * DAY
PRIORS = ("none", "history", "peers")


@dataclass
class Fleet:
    """One workload's instances after a deploy, and what was recorded of the previous build."""

    name: str
    family: str
    prior: str  # none | history | peers
    leak: bool
    description: str
    traces: list[Trace]  # the new processes, with the previous build's week when prior == history
    previous: list[Trace] = field(default_factory=list)  # prior == peers: the old pods' week
    deploy: float = DEPLOY


@dataclass
class Shape:
    """What each process of a fleet looks like; `Fleet` instances draw their own level and noise."""

    traffic: float = 0.08  # daily cycle of the floor, ± fraction of the level
    saw: float = 0.05
    noise: float = 0.002
    warm_depth: float = 0.3
    warm_tau: float = 20 * MINUTE
    fill: float = 0.0  # a cache filling after each start, fraction of the level
    fill_tau: float = 6 * HOUR
    launch: float = 0.0  # traffic growth after the deploy, fraction (a launch)
    launch_tau: float = 1.0 * DAY
    leak_to_oom: float | None = None  # leaking instances reach their limit this long after the deploy
    headroom: tuple[float, float] = (1.25, 1.45)  # limit = this × the healthy peak
    requests: bool = False  # emit a `requests_total` counter


def _instance(
    rng: random.Random,
    shape: Shape,
    name: str,
    phase: float,
    start: float,
    end: float,
    leaking: bool,
    previous_start: float | None,
) -> Trace:
    """One instance: the previous build's lifetime from `previous_start` (when given), then a new
    process at `start`. A leaking one leaks from `start` at the rate that reaches the limit
    `shape.leak_to_oom` later."""
    level = rng.uniform(1.5, 5) * GiB
    saw = shape.saw * rng.uniform(0.6, 1.4)
    saw_period = rng.uniform(3, 9) * MINUTE
    noise = shape.noise * rng.uniform(0.7, 1.3)
    warm_depth = shape.warm_depth * rng.uniform(0.7, 1.3)
    warm_tau = shape.warm_tau * rng.uniform(0.7, 1.5)
    first = previous_start if previous_start is not None else start
    n = int((end - first) / MINUTE)
    healthy: list[tuple[float, float]] = []
    rate: list[tuple[float, float]] = []
    for i in range(n):
        ts = first + i * MINUTE
        life_start = start if ts >= start else first
        age = ts - life_start
        daily = math.sin(2 * math.pi * (ts - phase) / DAY)
        launched = shape.launch * (1 - math.exp(-max(0.0, ts - start) / shape.launch_tau))
        traffic = (1 + shape.traffic * daily) * (1 + launched)
        floor = level * traffic
        floor *= 1 - warm_depth * math.exp(-age / warm_tau)
        floor += shape.fill * level * (1 - math.exp(-age / shape.fill_tau))
        cycle = ((ts + saw_period * 0.37) % saw_period) / saw_period
        value = floor + saw * level * traffic * cycle + rng.gauss(0, noise * level)
        healthy.append((ts, value))
        rate.append((ts, 50.0 * traffic * (1 + rng.gauss(0, 0.01))))
    peak = max(v for _, v in healthy)
    limit = rng.uniform(*shape.headroom) * peak
    slope = 0.0
    if leaking and shape.leak_to_oom is not None:
        slope = _rate_to_oom(healthy, limit, start, start + shape.leak_to_oom)
    points: list[tuple[float, float]] = []
    oom = None
    for ts, value in healthy:
        total = value + (slope * (ts - start) if slope and ts >= start else 0.0)
        points.append((ts, float(round(total))))
        if total >= limit:
            oom = ts
            break
    extra: dict[str, list[tuple[float, float]]] = {}
    if shape.requests:
        counter, total_requests = [], 0.0
        for ts, per_second in rate[: len(points)]:
            if ts == start:
                total_requests = 0.0  # a new process starts its counter at zero
            total_requests += per_second * MINUTE
            counter.append((ts, total_requests))
        extra["requests_total"] = counter
    restarts = [start] if previous_start is not None else []
    trace = Trace(name, leaking, "", points, limit, start if leaking else None, oom, extra)
    trace.restarts = restarts
    return trace


def _crossing(healthy: list[tuple[float, float]], limit: float, start: float, slope: float) -> float:
    return next((ts for ts, v in healthy if ts >= start and v + slope * (ts - start) >= limit), float("inf"))


def _rate_to_oom(healthy: list[tuple[float, float]], limit: float, start: float, target: float) -> float:
    """The leak rate whose first crossing of the limit comes within 30 minutes before `target`."""
    lo, hi = 0.0, limit / MINUTE
    for _ in range(60):
        mid = (lo + hi) / 2
        if _crossing(healthy, limit, start, mid) > target:
            lo = mid
        else:
            hi = mid
        if target - 30 * MINUTE <= _crossing(healthy, limit, start, hi) <= target:
            break
    return hi


def build_fleet(family: str, prior: str, seed: int, shape: Shape, leak: bool, description: str) -> Fleet:
    rng = random.Random(f"fleet/{family}/{prior}/{seed}")
    size = rng.randint(5, 20)
    phase = rng.uniform(0, DAY)
    end = DEPLOY + AFTER_DAYS * DAY
    leaking = set(range(size)) if leak else set()
    if leak and size > 5:  # most instances leak, a few of the new build stay healthy (other code paths)
        leaking = set(rng.sample(range(size), size - rng.randint(0, size // 5)))
    traces, previous = [], []
    for i in range(size):
        name = f"{family}-{prior}-{seed}/pod-{i}"
        before = DEPLOY - HISTORY_DAYS * DAY if prior == "history" else None
        traces.append(_instance(rng, shape, name, phase, DEPLOY, end, i in leaking, before))
        if prior == "peers":
            old = _instance(rng, shape, f"{family}-{prior}-{seed}/old-{i}", phase,
                            DEPLOY - HISTORY_DAYS * DAY, DEPLOY, False, None)  # fmt: skip
            previous.append(old)
    return Fleet(f"{family}/{prior}/{seed}", family, prior, leak, description, traces, previous)


def _leak(hours: float) -> Shape:
    return Shape(leak_to_oom=hours * HOUR)


FAMILIES: dict[str, tuple[bool, str, Callable[[], Shape]]] = {
    "fresh-leak-12h": (True, "fresh fleet, leak reaching the limit 12 h after the deploy", lambda: _leak(12)),
    "fresh-leak-24h": (True, "fresh fleet, leak reaching the limit 24 h after the deploy", lambda: _leak(24)),
    "fresh-leak-36h": (True, "fresh fleet, leak reaching the limit 36 h after the deploy", lambda: _leak(36)),
    "fresh-leak-60h": (True, "fresh fleet, leak reaching the limit 60 h after the deploy", lambda: _leak(60)),
    "fresh-warmup": (False, "fresh fleet, deep warm-up (40-60 % below, 1-2 h)",
                     lambda: Shape(warm_depth=0.5, warm_tau=40 * MINUTE)),
    "fresh-cache-day": (False, "fresh fleet, a cache filling for a day (+20 %)",
                        lambda: Shape(fill=0.2, fill_tau=7 * HOUR)),
    "fresh-launch": (False, "fresh fleet, traffic +40 % over 2 days after a launch, requests_total present",
                     lambda: Shape(launch=0.4, launch_tau=1.0 * DAY, requests=True)),
    "fresh-daily": (False, "fresh fleet, daily cycle ±8 %, noise", Shape),
}  # fmt: skip


def fleets(seeds: int = 1, priors: tuple[str, ...] = PRIORS) -> list[Fleet]:
    """Every family under every kind of prior, `seeds` fleets each; always the same fleets."""
    out = []
    for family, (leak, description, make) in FAMILIES.items():
        for prior in priors:
            for seed in range(seeds):
                out.append(build_fleet(family, prior, seed, make(), leak, description))
    return out
