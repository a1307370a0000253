"""Synthetic memory series for the detector tests, on a compressed time axis.

One test second stands for one production minute (`SCALE` = 60): the detectors run with
`PARAMS = DetectParams().scaled(60)` (window 6 min, season 24 min, ...) on samples one second
apart, so a 10-"day" series is 14,400 points and judges in a fraction of a second.
"""

from __future__ import annotations

import math
import random

from agent.detect import DetectParams, InstanceSeries

SCALE = 60.0
PARAMS = DetectParams().scaled(SCALE)
DAY = PARAMS.season  # one compressed day
HOUR = DAY / 24
T0 = 1_700_000_000 - 1_700_000_000 % DAY  # aligned to the (compressed) day
GiB = 2**30


def series(
    *,
    days: float = 6,
    base: float = 2 * GiB,
    limit: float | None = 3 * GiB,
    seed: int = 0,
    saw: float = 0.08,
    saw_period: float = 7.0,
    noise: float = 0.002,
    season: float = 0.0,
    leak_pct_h: float = 0.0,
    onset_day: float = 0.0,
    step_at_day: float | None = None,
    step: float = 0.12,
    bursts: list[tuple[float, float, float]] = (),
    warmup_depth: float = 0.0,
    warmup_tau_h: float = 0.5,
    restarts_days: list[float] = (),
    name: str = "x",
) -> InstanceSeries:
    """RSS of one instance: floor (+ daily cycle, step, leak, warm-up after each start) + a GC
    sawtooth + noise + bursts `(start day, duration h, height fraction)`. Restarts are given to
    the detectors as lifetimes, as the store would."""
    rng = random.Random(seed)
    points = []
    starts = [T0, *(T0 + d * DAY for d in restarts_days)]
    life = 0
    for i in range(int(days * DAY)):
        ts = T0 + i
        while life + 1 < len(starts) and ts >= starts[life + 1]:
            life += 1
        age = ts - starts[life]
        floor = base * (1 + season * (0.5 + 0.5 * math.sin(2 * math.pi * ts / DAY)))
        if step_at_day is not None and ts >= T0 + step_at_day * DAY:
            floor += step * base
        if leak_pct_h and ts >= T0 + onset_day * DAY:
            since = ts - max(T0 + onset_day * DAY, starts[life])
            floor += leak_pct_h / 100 * base * since / HOUR
        if warmup_depth:
            floor *= 1 - warmup_depth * math.exp(-age / (warmup_tau_h * HOUR))
        value = floor + saw * base * ((ts % saw_period) / saw_period) + rng.gauss(0, noise * base)
        for start, duration, height in bursts:
            if T0 + start * DAY <= ts < T0 + start * DAY + duration * HOUR:
                value += height * base
        points.append((float(ts), round(value)))
    return InstanceSeries(name, {"rss_bytes": points}, restarts=[s for s in starts[1:]], memory_limit=limit)


def oom_time(s: InstanceSeries) -> float | None:
    """First sample at or above the limit."""
    return next((ts for ts, v in s.series["rss_bytes"] if v >= (s.memory_limit or math.inf)), None)


def cut_at_oom(s: InstanceSeries) -> InstanceSeries:
    """The series up to its OOM (the process would be killed there)."""
    oom = oom_time(s)
    if oom is None:
        return s
    points = [p for p in s.series["rss_bytes"] if p[0] <= oom]
    return InstanceSeries(s.instance, {"rss_bytes": points}, restarts=s.restarts, memory_limit=s.memory_limit)


def kinds(findings) -> list[str]:
    return sorted({f.kind for f in findings})
