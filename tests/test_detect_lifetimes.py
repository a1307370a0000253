"""Evidence carried across lifetimes: an instance restarted every ~20 h by its orchestrator, RSS
falling to 60 % and warming back up each time, with no start time and no restart events. A leak
cut short by the restarts is found in its second or third lifetime and again in the ones after;
the same workload without the leak gets no finding."""

from __future__ import annotations

import math
import random

import pytest

from agent.detect import DetectParams, InstanceSeries
from agent.detect.memory.fleet import analyze_fleet

T0 = 1_767_571_200.0
HOUR, DAY, GiB = 3600.0, 86400.0, 2**30
LIMIT = 8 * GiB
LEVEL = 3.6 * GiB


def restarted(seed: int, leak_per_hour: float, days: float = 6.0) -> tuple[InstanceSeries, list[float]]:
    """One sample a minute; (series, restart times). The leak starts again from nothing in each
    lifetime, so the process never reaches its limit."""
    rng = random.Random(seed)
    restarts, ts = [], T0
    while (ts := ts + rng.uniform(18, 22) * HOUR) < T0 + days * DAY:
        restarts.append(ts)
    points, start = [], T0
    for i in range(int(days * DAY / 60)):
        ts = T0 + i * 60
        start = max([T0, *(r for r in restarts if r <= ts)])
        age = ts - start
        warm = 1 - 0.4 * math.exp(-age / (3 * HOUR)) if start > T0 else 1 - 0.35 * math.exp(-age / 1200)
        daily = 0.02 * LEVEL * math.sin(2 * math.pi * ts / DAY)
        saw = 0.03 * LEVEL * ((ts % 420) / 420)
        value = (LEVEL + daily) * warm + saw + rng.gauss(0, 0.003 * LEVEL) + leak_per_hour * age / HOUR
        points.append((ts, round(value)))
    series = InstanceSeries("svc", {"rss_bytes": points, "memory_limit_bytes": [(T0, LIMIT)]})
    return series, restarts


def findings(series: InstanceSeries):
    [analysis] = analyze_fleet([series], DetectParams())
    return [f for f in analysis.findings if f.kind in ("leak", "oom-risk") and f.opened_at is not None]


@pytest.mark.parametrize("seed", [0, 1])
def test_a_leak_cut_short_every_20_hours_is_found_within_three_lifetimes_and_in_the_later_ones(seed):
    series, restarts = restarted(seed, leak_per_hour=0.012 * LIMIT)
    found = findings(series)
    assert found, "the leak was never found"
    lifetimes = list(zip([T0, *restarts], [*restarts, T0 + 6 * DAY], strict=True))
    first = min(f.opened_at for f in found)
    assert first < lifetimes[2][1], "not found within three lifetimes"
    later = [(a, b) for a, b in lifetimes if a > first and b - a > 12 * HOUR]
    carried = [f for f in found if f.kind == "leak" and "lifetimes" in f.evidence and f.evidence["lifetimes"]]
    assert later and all(any(a <= f.opened_at < b for f in found) for a, b in later), (later, found)
    assert carried, "no finding said that the previous lifetime grew alike"
    assert "previous lifetime" in carried[0].summary


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_healthy_process_restarted_every_20_hours_gets_no_finding(seed):
    series, _ = restarted(seed, leak_per_hour=0.0)
    assert findings(series) == []
