"""Evidence carried across lifetimes.

An instance restarted every ~20 h by its orchestrator, RSS falling to 60 % and warming back up each
time, with no start time and no restart events: a leak cut short by the restarts is found in its
second or third lifetime and again in the ones after; the same workload without the leak gets no
finding.

A cache refilled after every deploy: a leak that starts with a lifetime hides under its concave
fill, and is found once the lifetime stays above the level its earlier lifetimes held; the same
workload without the leak, and one whose growth like log(t) outlives its predecessors, get none.
"""

from __future__ import annotations

import math
import random

import pytest

from agent.detect import DetectParams, InstanceSeries, analyze_instance, evaluate, update
from agent.detect.memory.context import OUTGROWN_FOR, OUTGROWN_MARGIN, Context, above_settled
from agent.detect.memory.fleet import analyze_fleet, with_priors
from agent.detect.memory.prepared import Prepared

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


def refilled(
    seed: int,
    leak_per_hour: float,
    lives: tuple[float, ...],
    level: float,
    log_growth: float = 0.0,
    swing: float = 0.04,
    noise: float = 0.004,
) -> tuple[InstanceSeries, list[float]]:
    """One sample a minute over lifetimes of `lives` seconds, with restart events: a cache refilling
    after each start (60 % of `level`, time constant 2 h), a daily `swing`, noise of `noise` of the
    level, and `log_growth` of
    the level times log(1 + age in hours). The leak, when any, starts with the last lifetime; the
    samples end at the limit (its OOM). (series, lifetime starts)."""
    rng = random.Random(seed)
    starts = [T0]
    for span in lives[:-1]:
        starts.append(starts[-1] + span)
    points, ts = [], T0
    while ts < starts[-1] + lives[-1]:
        start = max(s for s in starts if s <= ts)
        age = ts - start
        value = (
            level * (1 - 0.6 * math.exp(-age / (2 * HOUR)))
            + log_growth * level * math.log1p(age / HOUR)
            + swing * level * math.sin(2 * math.pi * ts / DAY)
            + 0.03 * level * ((ts % 420) / 420)
            + rng.gauss(0, noise * level)
            + (leak_per_hour * age / HOUR if start == starts[-1] else 0.0)
        )
        if value >= LIMIT:
            break
        points.append((ts, round(value)))
        ts += 60
    series = InstanceSeries("svc", {"rss_bytes": points, "memory_limit_bytes": [(T0, LIMIT)]}, starts[1:])
    return series, starts


@pytest.mark.parametrize("seed", [0, 1])
def test_a_leak_starting_with_a_lifetime_is_found_above_the_level_its_earlier_lifetimes_held(seed):
    leak = 0.1 * GiB
    series, starts = refilled(seed, leak, (2.5 * DAY, 2 * DAY), level=5.5 * GiB)
    oom = series.series["rss_bytes"][-1][0]
    found = [f for f in findings(series) if f.opened_at >= starts[-1]]
    assert found, "the leak under the refill was never found"
    first = min(found, key=lambda f: f.opened_at)
    # the fill alone hides it until the limit is hours away; the earlier lifetimes' level does not
    assert oom - first.opened_at >= 0.4 * (oom - starts[-1]), (first.summary, (oom - first.opened_at) / HOUR)
    assert first.kind == "leak" and "earlier lifetimes" in first.summary
    held = first.evidence["lifetimes"]["settled_level_bytes"]
    assert 5.5 * GiB < held < 6.2 * GiB  # the refilled level at its daily peak, not a burst or the fill
    # the rate reported is what still grows, not the fill beneath it
    assert 0.5 * leak < first.evidence["slope_bytes_per_second"] * HOUR < 2 * leak


def test_the_agent_judging_its_history_on_a_schedule_finds_it_when_the_replay_does():
    """The agent judges the last `history` of samples every so often (`evaluate`), not a replay."""
    params = DetectParams()
    series, starts = refilled(0, 0.1 * GiB, (2.5 * DAY, 2 * DAY), level=5.5 * GiB)
    offline = [
        (t.change, t.finding.kind, t.ts, t.finding.severity)
        for t in analyze_instance(series, params).transitions
    ]
    points = series.series["rss_bytes"]
    active, online = [], []
    for k in range(1, math.ceil((points[-1][0] - T0) / 1700) + 1):  # a cadence off the judgement grid
        now = min(T0 + 1700 * k, points[-1][0])
        since = now - params.history
        view = InstanceSeries(
            "svc",
            {"rss_bytes": [p for p in points if since <= p[0] <= now], "memory_limit_bytes": [(T0, LIMIT)]},
            restarts=[r for r in starts[1:] if since < r <= now],
            started_at=T0,
        )
        active, new = update(active, evaluate(view, now, params), params)
        online += [(t.change, t.finding.kind, t.ts, t.finding.severity) for t in new]
    assert online == offline
    assert ("opened", "leak") in [(change, kind) for change, kind, *_ in online]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_cache_refilled_after_every_deploy_to_the_same_level_gets_no_finding(seed):
    series, _ = refilled(seed, 0.0, (2.5 * DAY, 2 * DAY, 1.5 * DAY), level=5.5 * GiB)
    assert findings(series) == []


@pytest.mark.parametrize("seed", [0, 1])
def test_a_cache_refilled_in_harsh_noise_gets_no_finding_on_its_refills_and_a_leak_under_one_is_found(seed):
    """A 6 % daily swing and 1 % noise: over half a day a line and a sine fit a refill as well as a
    leak under the day's swing, so the cycle scale's early judgement waits while a lifetime is below
    the level its earlier lifetimes settled at. The first fill has no such level to go by."""
    series, starts = refilled(seed, 0.0, (2.5 * DAY, 2.5 * DAY, 2 * DAY), 0.8 * LIMIT, swing=0.06, noise=0.01)
    assert [
        (f.kind, (f.opened_at - starts[1]) / HOUR) for f in findings(series) if f.opened_at >= starts[1]
    ] == []
    leaking, starts = refilled(seed, 0.1 * GiB, (2.5 * DAY, 2 * DAY), level=5.5 * GiB, swing=0.06, noise=0.01)
    oom = leaking.series["rss_bytes"][-1][0]
    found = [f for f in findings(leaking) if f.opened_at >= starts[-1]]
    assert found and oom - min(f.opened_at for f in found) >= 0.4 * (oom - starts[-1])


@pytest.mark.parametrize("seed", [0, 1])
def test_a_leak_within_the_warm_up_its_prior_learned_is_judged_after_half_a_day(seed):
    """Growth like log(t) over a first lifetime of four days reaches its settled level only after a
    day: its prior learns a warm-up that long. A leak from the next start would go unjudged until
    that warm-up ended, after its OOM: a learned warm-up counts for half a period at most."""
    series, starts = refilled(seed, 0.15 * GiB, (4 * DAY, 1.5 * DAY), level=3 * GiB, log_growth=0.15)
    [prep] = with_priors([series], DetectParams(), None)
    assert prep.prior_for(1) is not None and prep.prior_for(1).warmup > DAY
    assert prep.warmup(1) == DAY / 2
    oom = series.series["rss_bytes"][-1][0]
    found = [f.opened_at for f in findings(series) if f.opened_at >= starts[-1]]
    assert found and oom - min(found) >= 0.3 * (oom - starts[-1])


def test_a_lifetime_growing_like_log_t_past_the_age_of_its_predecessors_is_not_held_to_their_level():
    series, starts = refilled(0, 0.0, (2 * DAY, 7 * DAY), level=3 * GiB, log_growth=0.15)
    params = DetectParams()
    prep = Prepared(series, params)
    tick = math.floor((starts[-1] + 6 * DAY) / params.step) * params.step
    newest = [v for ts, v in series.series["rss_bytes"] if tick - OUTGROWN_FOR * params.bucket <= ts < tick]
    before = [v for ts, v in series.series["rss_bytes"] if starts[0] + DAY <= ts < starts[1]]
    floors = [min(before[k : k + 15]) for k in range(0, len(before), 15)]  # a floor per 15 min
    assert min(newest) > (1 + OUTGROWN_MARGIN) * max(floors)  # above them, at an age they never reached
    ctx = Context.at(prep, tick)
    assert ctx is not None and ctx.life == 1
    assert above_settled(ctx, "rss_bytes") is None
    # (a log-shaped lifetime cut short may still read as the previous one's growth carried on)
    assert not [f for f in findings(series) if "settled_level_bytes" in f.evidence.get("lifetimes", {})]
