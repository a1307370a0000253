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


def fresh(
    *,
    name: str = "pod",
    seed: int = 0,
    hours: float = 72,
    base: float = 2 * GiB,
    traffic: float = 0.08,
    limit: float = 3 * GiB,
    leak_pct_h: float = 0.0,
    launch: float = 0.0,
    requests: bool = False,
    history_days: float = 0.0,
    step_at_hour: float | None = None,
    step: float = 0.06,
) -> InstanceSeries:
    """A process started at a deploy (`T0 + history_days`): a daily traffic cycle of ±`traffic`,
    a warm-up, noise, and a leak of `leak_pct_h` of the base per hour from its start. `launch`
    raises the traffic (and the memory with it) by that fraction, steadily over two days; `requests`
    adds a `requests_total` counter; `history_days` of an earlier healthy lifetime come first;
    `step_at_hour` raises the level by `step` of the base that long after the deploy (a reload)."""
    rng = random.Random(seed)
    deploy = T0 + history_days * DAY
    points, counter = [], []
    total = 0.0
    for i in range(int(history_days * DAY + hours * HOUR)):
        ts = T0 + i
        start = deploy if ts >= deploy else T0
        age = ts - start
        load = (1 + traffic * math.sin(2 * math.pi * ts / DAY)) * (
            1 + (launch * min(age / (2 * DAY), 1.0) if ts >= deploy else 0.0)
        )
        floor = base * load * (1 - 0.3 * math.exp(-age / (0.3 * HOUR)))
        if ts >= deploy:
            floor += leak_pct_h / 100 * base * age / HOUR
            if step_at_hour is not None and age >= step_at_hour * HOUR:
                floor += step * base
        points.append(
            (float(ts), round(floor + 0.04 * base * load * ((ts % 5) / 5) + rng.gauss(0, 0.002 * base)))
        )
        total = 0.0 if ts == deploy else total
        total += 50 * load
        counter.append((float(ts), total))
    metrics = {"rss_bytes": points, **({"requests_total": counter} if requests else {})}
    return InstanceSeries(name, metrics, restarts=[deploy] if history_days else [], memory_limit=limit)
