"""Growth that levels off is not a leak: the concave curve beside the line, on shapes and on a real
glibc process whose fragmentation grows like log(t)."""

from __future__ import annotations

import math
import random

import pytest

from agent.detect import DetectParams, InstanceSeries, analyze_instance
from agent.detect.memory.saturation import RATE_RATIO, levelling, reach_bar, reach_margin
from agent.guardrail.growth import judge_series
from support.native import start_target
from support.workloads import build_c_target, target_env

MINUTE = 60.0
T0 = 1_767_571_200.0


def _points(shape, n: int, noise: float, seed: int = 0) -> tuple[list[float], list[float]]:
    rng = random.Random(seed)
    xs = [i * 900.0 for i in range(n)]
    return xs, [shape(x) + rng.gauss(0, noise) for x in xs]


def test_a_cache_filling_to_its_ttl_levels_and_its_projection_levels_too():
    xs, ys = _points(lambda x: 1e9 * (1 - math.exp(-x / 7200)), 20, 5e6)
    curve = levelling(xs, ys)
    assert curve is not None and curve.levelled
    assert 0.9e9 < curve.asymptote < 1.1e9
    assert curve.time_to(1.2e9) is None  # it never gets there
    assert curve.time_to(curve.now) == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_a_steady_leak_is_no_levelling_curve(seed):
    xs, ys = _points(lambda x: 1e9 + 50 * x, 24, 2e6, seed)
    curve = levelling(xs, ys)
    assert curve is None or not curve.possible


@pytest.mark.parametrize("seed", range(5))
def test_the_reach_test_rejects_the_curves_below_the_limit_for_a_leak_and_not_for_a_cache_still_filling(seed):
    """Both project the limit within a quarter of the horizon along a line. A steady leak 3 h from it
    rejects every curve that stays below it for 6 h; a cache 2.5 h into filling with a time
    constant of 4 h, 600 MB short of the limit, does not (its own curve rises 416 MB in 6 h)."""
    bar, within = reach_bar(0.999), 6 * 3600.0
    xs, leak = _points(lambda x: 1e9 + 5e4 * x, 24, 5e6, seed)
    assert reach_margin(xs, leak, 5e4 * 3 * 3600, within) >= bar
    xs, cache = _points(lambda x: 1e9 * (1 - math.exp(-x / 14400)), 11, 1e7, seed)
    assert (6e8 / ((cache[-1] - cache[0]) / xs[-1])) < within  # the line projects the limit within 6 h
    assert reach_margin(xs, cache, 6e8, within) < bar


def test_one_burst_at_the_end_does_not_hide_the_bend():
    """A cache filling, and a burst that filled the newest bucket: the line alone would project a
    critical OOM; the buckets before the burst still show the growth levelling off."""
    params = DetectParams()
    n = 10 * 15  # 2.5 h of one-minute samples after the start, bucket floors from the samples
    rss = [(T0 + i * MINUTE, 3e9 + 1.2e9 * (1 - math.exp(-i * MINUTE / 7200))) for i in range(n)]
    rss += [(T0 + (n + i) * MINUTE, 3e9 + 1.2e9 + 4e8) for i in range(16)]
    series = InstanceSeries("cache", {"rss_bytes": rss}, restarts=[], memory_limit=4.8e9)
    found = analyze_instance(series, params)
    assert not any(f.severity == "critical" for f in found.findings)


@pytest.mark.parametrize("seed", range(3))
def test_a_levelling_verdict_states_the_slope_that_decided_it(seed):
    """A server's 45 s guardrail run: a warm-up step, then slower growth. The trend's own recent slope
    is steady (over half the window's), the curve beside it is what levels: the summary gives the
    curve's figure, not the trend's 100 % and more."""
    rng, start = random.Random(seed), 1e6
    rss = [
        (start + i * 0.25, 72e6 + 5e6 * (1 - math.exp(-i * 0.25 / 3)) + 0.2e6 * i * 0.25 + rng.gauss(0, 5e4))
        for i in range(180)
    ]
    leak = next(o for o in judge_series({"rss_bytes": rss}, start, start + 45) if o.kind == "leak")
    assert leak.verdict == "working-set-plateau", leak.summary
    stated = float(leak.summary.split("recent slope ")[1].split("%")[0])
    assert stated < 100 * RATE_RATIO, leak.summary


@pytest.fixture(scope="module")
def c_binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_c_target(tmp_path_factory.mktemp("bin"))


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm", "rb") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.native
@pytest.mark.slow
def test_a_glibc_process_fragmenting_like_log_t_is_never_a_leak(spawn, c_binary: str) -> None:
    """A real glibc process leaves holes between the objects it keeps at a rate that falls like 1/t, so
    its RSS grows like log(t) with no allocator statistics to tell. Each command's answer is one
    sample, one production minute apart (the process is judged on a stretched time axis, as the
    recorded corpus is): over ten hours no judgement may call it a leak, at any severity."""
    target = start_target(spawn, [c_binary], target_env("glibc"))
    pid = target.pid
    rss = []
    for i in range(600):
        size = 64 + 8 * i  # every hole is smaller than what later steps ask for: none is reused
        count = max(1, round(44 * 2**20 / (i + 20) / size))
        target.command(f"frag {count} {size} 2")  # answers once the holes are made
        rss.append((T0 + i * MINUTE, float(_rss(pid))))
    target.exit()
    assert rss[-1][1] - rss[0][1] > 32 * 2**20  # it did grow
    limit = rss[-1][1] / 0.85
    series = InstanceSeries("frag", {"rss_bytes": rss}, restarts=[], memory_limit=limit)
    found = analyze_instance(series, DetectParams())
    verdicts = {(t.finding.kind, t.finding.verdict) for t in found.transitions}
    assert not any(kind == "leak" or verdict == "leak" for kind, verdict in verdicts), verdicts
    assert not any(f.severity == "critical" for f in found.findings)
