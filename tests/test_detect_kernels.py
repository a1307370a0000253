"""The trend test's C kernels give exactly what their Python twins give, and step aside for
anything that is not a list of floats."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.detect import trend

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
