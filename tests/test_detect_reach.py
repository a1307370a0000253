"""The reach test: critical only when every curve that stays below the limit is rejected."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.detect.reach import FALSE_RATE, reach_test

HOUR = 3600.0
XS = [i * 900.0 for i in range(24)]  # a window of 24 buckets of 15 minutes


def _ar1(rng: random.Random, n: int, sigma: float, rho: float) -> list[float]:
    out, e = [], 0.0
    for _ in range(n):
        e = rho * e + rng.gauss(0, sigma * math.sqrt(1 - rho * rho))
        out.append(e)
    return out


def test_a_steady_leak_that_reaches_the_limit_soon_is_shown_to():
    rng = random.Random(1)
    ys = [x / HOUR + rng.gauss(0, 0.2) for x in XS]  # 1 unit an hour, 6 hours seen
    found = reach_test(XS, ys, rise=3.0, within=24 * HOUR)
    assert found is not None and found.reaches and found.p_value <= FALSE_RATE


def test_six_hours_of_a_line_cannot_show_a_limit_a_day_ahead():
    """A curve levelling off a day from now fits six hours of a line as well: no critical."""
    rng = random.Random(2)
    ys = [x / HOUR + rng.gauss(0, 0.2) for x in XS]
    found = reach_test(XS, ys, rise=22.0, within=24 * HOUR)
    assert found is not None and not found.reaches


def test_a_cache_filling_to_its_level_below_the_limit_is_never_a_reach():
    """The healthy case the test is built for: 300 draws of a cache filling (TTL 2-12 h) under
    autocorrelated noise, each with its level below the limit: none is called a reach."""
    rng = random.Random(3)
    calls = 0
    for _ in range(300):
        tau = rng.uniform(0.5, 4) * HOUR
        size = rng.uniform(5, 20)
        start = rng.uniform(0, 3) * HOUR  # the window may start after the cache began filling
        noise = _ar1(rng, len(XS), sigma=rng.uniform(0.02, 0.3), rho=rng.uniform(0, 0.8))
        ys = [size * (1 - math.exp(-(x + start) / tau)) + e for x, e in zip(XS, noise, strict=True)]
        left = size * math.exp(-(XS[-1] + start) / tau)  # what the cache still fills
        gap = left + rng.uniform(0.05, 2)  # the limit lies above the level it fills to
        found = reach_test(XS, ys, rise=gap, within=24 * HOUR)
        calls += bool(found and found.reaches)
    assert calls == 0


def test_log_shaped_growth_below_the_limit_is_not_a_reach():
    rng = random.Random(4)
    for _ in range(100):
        tau0 = rng.uniform(0.3, 1) * HOUR
        offset = rng.uniform(1, 48) * HOUR  # hours or days into the lifetime
        size = rng.uniform(1, 4)
        ys = [size * math.log1p((x + offset) / tau0) + rng.gauss(0, 0.05) for x in XS]
        end = size * math.log1p((XS[-1] + offset + 24 * HOUR) / tau0)
        found = reach_test(XS, ys, rise=end - ys[-1] + 0.5, within=24 * HOUR)
        assert not (found and found.reaches)


def test_too_few_buckets_cannot_tell_and_no_room_left_is_reached():
    assert reach_test(XS[:5], [0.0, 1, 2, 3, 4], rise=1.0, within=HOUR) is None
    found = reach_test(XS, [float(i) for i in range(24)], rise=0.0, within=HOUR)
    assert found is not None and found.reaches


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    shift=st.floats(-1e9, 1e9),
    scale=st.floats(1e-3, 1e6),
    rise=st.floats(0.1, 50),
)
def test_the_test_reads_the_shape_not_the_units(seed, shift, scale, rise):
    """Bytes or GiB, an offset or none: the statistic is the same."""
    rng = random.Random(seed)
    ys = [x / HOUR + 3 * (1 - math.exp(-x / (2 * HOUR))) + rng.gauss(0, 0.3) for x in XS]
    plain = reach_test(XS, ys, rise, 24 * HOUR)
    moved = reach_test(XS, [shift + scale * y for y in ys], rise * scale, 24 * HOUR)
    assert plain is not None and moved is not None
    assert math.isclose(plain.stat, moved.stat, rel_tol=1e-3, abs_tol=1e-3 + 1e-12 * abs(shift) / scale)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), rise=st.floats(0.1, 40), more=st.floats(0.0, 40))
def test_more_room_to_the_limit_is_never_stronger_evidence(seed, rise, more):
    rng = random.Random(seed)
    ys = [x / HOUR + rng.gauss(0, 0.5) for x in XS]
    near = reach_test(XS, ys, rise, 24 * HOUR)
    far = reach_test(XS, ys, rise + more, 24 * HOUR)
    assert near is not None and far is not None
    assert far.stat <= near.stat + 1e-9
