"""Invariants of the detectors (hypothesis): units do not matter, restarts never make a leak."""

from __future__ import annotations

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from agent.detect import InstanceSeries, analyze_instance
from support.detect_shapes import DAY, PARAMS, T0, series

SHAPES = st.sampled_from(
    [
        {},
        {"saw": 0.25, "saw_period": 3},
        {"season": 0.05},
        {"step_at_day": 1.3},
        {"bursts": [(1.1, 1.0, 0.3)]},
        {"leak_pct_h": 3, "onset_day": 1.0},
        {"leak_pct_h": 6, "onset_day": 0.4},
    ]
)
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _summary(result):
    return [(f.kind, f.verdict, f.opened_at, f.resolved_at, f.severity) for f in result.findings]


def _scaled(s: InstanceSeries, factor: float) -> InstanceSeries:
    points = [(ts, v * factor) for ts, v in s.series["rss_bytes"]]
    limit = s.memory_limit * factor if s.memory_limit is not None else None
    return InstanceSeries(s.instance, {"rss_bytes": points}, restarts=s.restarts, memory_limit=limit)


@FAST
@given(shape=SHAPES, seed=st.integers(0, 1000), exponent=st.integers(-12, 12))
def test_scaling_a_series_and_its_limit_changes_no_verdict_and_no_time(shape, seed, exponent):
    """Bytes or KiB, small or large process: the same findings at the same times. Powers of two
    keep the floating-point arithmetic exact, so the results must be identical."""
    s = series(days=2, seed=seed, **shape)
    assert _summary(analyze_instance(_scaled(s, 2.0**exponent), PARAMS)) == _summary(
        analyze_instance(s, PARAMS)
    )


@FAST
@given(
    shape=st.sampled_from([{}, {"saw": 0.25, "saw_period": 3}, {"season": 0.05}, {"step_at_day": 1.3}]),
    seed=st.integers(0, 1000),
    restart_day=st.floats(0.2, 1.8),
    depth=st.floats(0.1, 0.6),
    tau_minutes=st.floats(1.0, 25.0),
)
# a reload step a few hours after the restart lifts the lifetime above its predecessor's level: until
# the step can be removed, its recent slope is the step, not a leak outgrowing its fill
@example(shape={"step_at_day": 1.3}, seed=0, restart_day=1.0625, depth=0.5, tau_minutes=1.0)
@example(shape={"step_at_day": 1.3}, seed=336, restart_day=1.043, depth=0.16, tau_minutes=1.1)
def test_adding_a_restart_to_a_healthy_series_does_not_create_a_leak(
    shape, seed, restart_day, depth, tau_minutes
):
    """The process restarts at a random time and warms up again from well below its working set."""
    healthy = series(days=2, seed=seed, **shape)
    assert not [f for f in analyze_instance(healthy, PARAMS).findings if f.kind == "leak"]
    restart = T0 + restart_day * DAY
    tau = tau_minutes  # one test second is one production minute
    points = []
    for ts, v in healthy.series["rss_bytes"]:
        if ts >= restart:
            v *= 1 - depth * 2.718281828 ** (-(ts - restart) / tau)
        points.append((ts, v))
    restarted = InstanceSeries(
        "x", {"rss_bytes": points}, restarts=[restart], memory_limit=healthy.memory_limit
    )
    result = analyze_instance(restarted, PARAMS)
    assert not [f for f in result.findings if f.kind == "leak"], [f.summary for f in result.findings]
    assert result.restarts == [restart]


@FAST
@given(seed=st.integers(0, 1000), restart_day=st.floats(0.2, 1.8), depth=st.floats(0.6, 0.9))
def test_an_unmarked_reset_is_found_as_a_restart_offline(seed, restart_day, depth):
    """Without restart events (a plain recording), a drop below half the floor starts a new lifetime."""
    healthy = series(days=2, seed=seed)
    restart = T0 + restart_day * DAY
    points = [
        (ts, v * (1 - depth) if restart <= ts < restart + 30 else v) for ts, v in healthy.series["rss_bytes"]
    ]
    s = InstanceSeries("x", {"rss_bytes": points}, restarts=None, memory_limit=healthy.memory_limit)
    result = analyze_instance(s, PARAMS)
    assert len(result.restarts) == 1 and abs(result.restarts[0] - restart) <= PARAMS.bucket
    assert not [f for f in result.findings if f.kind == "leak"]
