"""The robust trend of a lower envelope: steps, bursts, growth, deceleration, significance."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from agent.detect.trend import mann_kendall, might_rise, remove_steps, theil_sen, thirds_rise, trend


def _fit(ys: list[float], floor: float = 1.0):
    xs = [float(i) for i in range(len(ys))]
    steps = remove_steps(ys, floor)
    return trend(xs, ys, steps, mann_kendall(steps.clean)[1])


def _noise(n: int, sigma: float, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(0, sigma) for _ in range(n)]


def test_linear_growth_is_significant_and_its_slope_is_right():
    ys = [100 + 2.0 * i + e for i, e in enumerate(_noise(24, 1.0))]
    t = _fit(ys)
    assert abs(t.slope - 2.0) < 0.2
    assert t.confidence > 0.999
    assert 0.7 < t.decel < 1.4


def test_a_step_that_stays_flat_is_removed_and_is_not_growth():
    ys = [100 + e for e in _noise(12, 1.0, 1)] + [160 + e for e in _noise(12, 1.0, 2)]
    steps = remove_steps(ys, floor=5.0)
    assert steps.count == 1
    assert not steps.risen
    assert _fit(ys, floor=5.0).confidence < 0.9


def test_a_staircase_of_many_steps_is_kept_as_growth():
    ys = [100 + 30 * (i // 3) + e for i, e in enumerate(_noise(24, 0.5, 3))]
    steps = remove_steps(ys, floor=5.0)
    assert steps.count == 0
    assert _fit(ys, floor=5.0).confidence > 0.999


def test_a_short_burst_is_not_a_step():
    ys = [100 + e for e in _noise(24, 1.0, 4)]
    ys[10:12] = [190.0, 188.0]
    assert remove_steps(ys, floor=5.0).count == 0
    assert _fit(ys, floor=5.0).confidence < 0.999


def test_growth_that_levels_off_decelerates():
    ys = [100 + 80 * (1 - math.exp(-i / 4)) for i in range(24)]
    assert _fit(ys).decel < 0.5


def test_growth_that_starts_inside_the_window_does_not_count_as_deceleration():
    ys = [100.0] * 12 + [100 + 3.0 * i for i in range(1, 13)]
    assert _fit(ys).decel > 1.0


def test_flat_noise_is_not_significant():
    assert _fit([100 + e for e in _noise(24, 3.0, 5)]).confidence < 0.99


def test_autocorrelated_wander_is_less_significant_than_the_raw_test_says():
    rng = random.Random(6)
    level, ys = 0.0, []
    for _ in range(24):
        level = 0.95 * level + rng.gauss(0, 1)
        ys.append(100 + level + 0.3 * len(ys))
    steps = remove_steps(ys, 5.0)
    raw_z = mann_kendall(steps.clean)[1]
    assert _fit(ys, floor=5.0).z <= raw_z


def test_theil_sen_ignores_a_wild_point():
    xs = [float(i) for i in range(11)]
    ys = [3.0 * x for x in xs]
    ys[5] = 1e9
    assert theil_sen(xs, ys) == 3.0


def test_mann_kendall_counts_rising_minus_falling_pairs():
    assert mann_kendall([1, 2, 3, 4])[0] == 6
    assert mann_kendall([4, 3, 2, 1])[0] == -6
    assert mann_kendall([1, 1, 1])[0] == 0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=4, max_size=40),
    st.floats(min_value=0.0, max_value=1e5),
)
def test_the_cheap_gate_never_hides_a_window_that_has_risen(ys, floor):
    """`might_rise` is a necessary condition: when it says no, removing steps finds no rise;
    and passing the raw rise along changes nothing."""
    raw = thirds_rise(ys)
    if not might_rise(ys, floor, raw):
        assert not remove_steps(ys, floor).risen
    given, made = remove_steps(ys, floor, raw), remove_steps(ys, floor)
    assert given == made and given.rise == made.rise
