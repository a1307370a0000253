"""The trend test's C kernels give exactly what their Python twins give, and step aside for
anything that is not a list of floats."""

from __future__ import annotations

import itertools
import math
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.detect import trend
from agent.detect.memory import envelope

kernels = trend._kernels

finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)


def test_the_kernels_are_built_with_the_package():
    """`pip install` (and `make test`) compiles them: without them a replay is slower, not wrong."""
    assert kernels is not None


@settings(max_examples=400, deadline=None)
@given(st.data(), st.integers(2, 40))
def test_the_median_pairwise_slope_equals_the_python_one(data, n):
    steps = data.draw(st.lists(st.floats(min_value=0.5, max_value=5000.0), min_size=n - 1, max_size=n - 1))
    xs = [1.7e9]
    for step in steps:
        xs.append(xs[-1] + step)  # increasing, unevenly spaced
    if data.draw(st.booleans()):
        xs = [1.7e9 + 900.0 * i + 450.0 for i in range(n)]  # a window without gaps
    ys = data.draw(st.lists(st.one_of(finite, st.sampled_from([0.0, 1.0, -1.0])), min_size=n, max_size=n))
    python = trend._median_sorted(trend._pair_slopes(xs, ys)) if n > 2 else (ys[1] - ys[0]) / (xs[1] - xs[0])
    assert kernels.slope_median(xs, ys) == python


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(finite, st.sampled_from([0.0, 1.0, 2.0])), max_size=60))
def test_the_mann_kendall_score_equals_the_python_one(ys):
    assert kernels.mk_score(ys) == trend.mk_score(ys)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.one_of(finite, st.sampled_from([0.0, 1.0, 2.0])), min_size=3, max_size=120),
    st.lists(st.tuples(st.integers(1, 119), st.sampled_from([-1e3, -30.0, 10.0, 50.0, 1e6])), max_size=3),
    st.sampled_from([0.0, 0.5, 2.0, 1e9]),
)
def test_removing_steps_equals_the_python_one(noise, jumps, floor):
    """Level shifts (up to three, so that too many for a reload are seen too) on any noise."""
    ys = [y + sum(size for at, size in jumps if i >= at) for i, y in enumerate(noise)]
    fast, python = trend.remove_steps(ys, floor, 0.5), trend._remove_steps(ys, floor, 0.5)
    assert (fast.clean, fast.count, fast.noise, fast._rise) == (
        python.clean,
        python.count,
        python.noise,
        python._rise,
    )
    assert (fast.clean is ys) == (python.clean is ys)


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.one_of(finite, st.sampled_from([0.0, 1.0, 2.0, float("inf"), -float("inf")])), max_size=80)
)
def test_the_median_and_the_rise_of_thirds_equal_the_python_ones(ys):
    def sorted_median(values):
        ordered = sorted(values)
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])

    if ys:
        both = [kernels.median(ys), sorted_median(ys)]
        assert both[0] == both[1] or all(math.isnan(m) for m in both)  # inf - inf: NaN either way
    if len(ys) >= 2:
        k = max(2, len(ys) // 3)
        python = sorted_median(ys[-k:]) - sorted_median(ys[:k])
        fast = kernels.thirds_rise(ys)
        assert fast == python or (math.isnan(fast) and math.isnan(python))


def test_a_median_of_what_c_does_not_model_is_python_s():
    assert kernels.median([]) is None and kernels.thirds_rise([1.0]) is None
    assert kernels.median([1.0, float("nan")]) is None and kernels.thirds_rise([1.0, 2, 3.0]) is None
    assert trend.median([3, 1, 2]) == 2 and trend.thirds_rise([1, 2, 3, 4, 5, 6]) == 4.0
    with pytest.raises(IndexError):
        trend.median([])


def test_steps_are_removed_in_c_only_where_it_models_them():
    assert kernels.steps_removed([1.0, 2.0], 0.0) is None  # too short for a median of changes
    assert kernels.steps_removed([1.0] * 513, 0.0) is None  # far longer than any fit
    assert kernels.steps_removed([1.0, 2.0, float("nan")], 0.0) is None
    assert kernels.steps_removed([1.0, 2.0, 3], 0.0) is None
    assert kernels.steps_removed([0.0] * 10 + [100.0] * 10, 1.0) == (1, 0.0, [0.0] * 20)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from([1.7e9, 0.0, -5e3, 1.7e9 + 0.3]),
    st.lists(
        st.one_of(st.sampled_from([0.0, 1.0, 15.0, 60.0, 900.0, 1e-7]), st.floats(0, 5000)), max_size=200
    ),
    st.sampled_from([900.0, 60.0, 0.1, 1e-3, 86400.0, 7.0]),
    st.data(),
)
def test_cutting_samples_into_buckets_equals_the_python_one(start, steps, width, data):
    """Times in order (repeats, tiny and wide steps), any values: the same buckets, floors and peaks."""
    times = list(itertools.accumulate(steps, initial=start))[1:]
    values = data.draw(
        st.lists(st.one_of(finite, st.just(float("nan"))), min_size=len(times), max_size=len(times))
    )
    idx, firsts, ends = envelope._buckets(times, width)
    python = (idx, firsts, ends, *envelope._floors_and_peaks(values, firsts, ends))
    assert repr(envelope._cut(times, values, width)) == repr(python)  # NaN and -0.0 included


def test_buckets_are_cut_in_c_only_for_times_in_order():
    assert kernels.bucket_floors([2000.0, 1000.0], [1.0, 2.0], 900.0) is None
    assert kernels.bucket_floors([1.0, float("inf")], [1.0, 2.0], 900.0) is None
    assert kernels.bucket_floors([1.0, 2.0], [1.0, 2.0], 0.0) is None
    assert kernels.bucket_floors([1.0, 2], [1.0, 2.0], 900.0) is None
    assert kernels.bucket_floors([1.0, 950.0, 960.0], [5.0, 2.0, 3.0], 900.0) == (
        [0, 1],
        [0, 1],
        [5.0, 2.0],
        [5.0, 3.0],
    )


def test_anything_but_lists_of_floats_is_left_to_python():
    assert kernels.slope_median([1, 2, 3], [1.0, 2.0, 3.0]) is None  # ints: Python's exact arithmetic
    assert kernels.slope_median((1.0, 2.0), (1.0, 2.0)) is None
    assert kernels.slope_median([1.0, 2.0], [1.0]) is None
    assert kernels.mk_score([1.0, 2, 3.0]) is None
    assert trend.slope_median([0.0, 1.0, 2.0], [0, 2, 4]) == 2.0  # and Python answers
    assert trend.mann_kendall([1, 2, 3, 4])[0] == 6


def test_equal_times_fail_as_in_python():
    with pytest.raises(ZeroDivisionError):
        kernels.slope_median([1.0, 1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ZeroDivisionError):
        trend._pair_slopes([1.0, 1.0, 2.0], [1.0, 2.0, 3.0])


def test_bucket_quantiles_refuses_what_is_not_k_columns_of_doubles():
    from array import array

    bounds = array("d", [0.1, float("inf")]).tobytes()
    with pytest.raises(TypeError):
        kernels.bucket_quantiles(bounds, [1.0, 2.0], 0.99)
    with pytest.raises(ValueError):
        kernels.bucket_quantiles(bounds, array("d", [1.0, 2.0, 3.0]).tobytes(), 0.99)
    with pytest.raises(TypeError):
        kernels.bucket_quantiles(bounds, b"")
    counts = array("d", [0, 5, 5, 0, 10, 20]).tobytes()  # le=0.1: 0, 5, 5; +Inf: 0, 10, 20
    got = array("d")
    got.frombytes(kernels.bucket_quantiles(bounds, counts, 0.5))
    assert list(got) == [0.1, 0.1]  # the top of the first bucket, then a rank in +Inf


@settings(max_examples=300, deadline=None)
@given(st.data(), st.integers(1, 4), st.integers(1, 30), st.integers(1, 6))
def test_the_relative_rules_screen_flags_what_its_python_twin_flags(data, instances, count, judged):
    """`rising_screen` against `rising_flags`: ratios near the rule's 30 % and 15 % thresholds,
    missing ones (nan), instants with no tick (None), and ratios that follow their peers' level
    (an elasticity), so every flag of both is given."""
    from agent.detect.slow.relative import _GROW, _STEADY, ELASTICITY_T, rising_flags
    from agent.detect.slow.rules import BASELINE_POINTS, RELATIVE_POINTS

    ratio = st.one_of(
        st.floats(min_value=0.2, max_value=3.0), st.sampled_from([math.nan, 1.0, 1.15, 1.3, 0.5])
    )
    level = st.floats(min_value=0.01, max_value=2.0)
    ratios, peers = [], []
    for _ in range(instances):
        own = data.draw(st.lists(level, min_size=count, max_size=count))
        if data.draw(st.booleans()):  # its ratio moves with the fleet's level, give or take a little
            slope = data.draw(st.floats(min_value=-0.5, max_value=0.5))
            ratio_of = [0.8 * p**slope * data.draw(st.floats(min_value=0.97, max_value=1.03)) for p in own]
        else:
            ratio_of = data.draw(st.lists(ratio, min_size=count, max_size=count))
        ratios.append(ratio_of)
        peers.append(own)
    place = st.one_of(st.none(), st.integers(0, count - 1))
    width = BASELINE_POINTS + RELATIVE_POINTS
    places = [data.draw(st.lists(place, min_size=width, max_size=width)) for _ in range(judged)]
    flags = kernels.rising_screen(
        array("d", itertools.chain.from_iterable(ratios)).tobytes(),
        array("d", itertools.chain.from_iterable(peers)).tobytes(),
        count,
        array("d", (-1.0 if k is None else k for row in places for k in row)).tobytes(),
        BASELINE_POINTS,
        RELATIVE_POINTS,
        (_GROW, _STEADY, ELASTICITY_T),
    )
    assert flags == rising_flags(ratios, peers, places)


def test_the_relative_rules_screen_refuses_what_it_cannot_read():
    """Sizes that do not divide and instants that are no tick are errors, not reads past the end."""
    ratios = array("d", [1.0, 1.2, 1.4]).tobytes()
    numbers = (1.3, 1.15, 3.0)
    with pytest.raises(ValueError, match="do not divide"):
        kernels.rising_screen(ratios, ratios, 2, array("d", [0.0] * 24).tobytes(), 12, 12, numbers)
    with pytest.raises(ValueError, match="do not divide"):
        kernels.rising_screen(ratios, ratios[:8], 3, array("d", [0.0] * 24).tobytes(), 12, 12, numbers)
    with pytest.raises(ValueError, match="no tick"):
        kernels.rising_screen(ratios, ratios, 3, array("d", [3.0] * 24).tobytes(), 12, 12, numbers)
    with pytest.raises(ValueError, match="no tick"):
        kernels.rising_screen(ratios, ratios, 3, array("d", [math.nan] * 24).tobytes(), 12, 12, numbers)
    with pytest.raises(TypeError):
        kernels.rising_screen("not bytes", ratios, 3, b"", 12, 12, numbers)
    with pytest.raises(TypeError):
        kernels.rising_screen(ratios, ratios, 3, b"", 12, 12, (1.3,))
