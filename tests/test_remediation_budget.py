"""The restart budget as a pure function of (restarts so far, time): tables on a fake clock, and properties."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remediation.budget import HOUR, BudgetLimits, BudgetState, admit
from remediation.model import RestartRecord
from remediation.planner import earliest_start
from remediation.windows import Windows

T0 = 1_700_000_000.0
LIMITS = BudgetLimits(max_concurrent=1, min_interval=600, max_per_hour=3, cooldown=3600)


def done(instance, start, minutes=5, fleet="ranker"):
    return RestartRecord(instance, fleet, "agent-a", T0 + start, T0 + start + minutes * 60, "succeeded")


def running(instance, start, fleet="ranker"):
    return RestartRecord(instance, fleet, "agent-a", T0 + start)


CASES = [
    # (history, instance, at (s after T0), limits, expected code, retry_at (s after T0) or None)
    ([], "s1", 0, LIMITS, "ok", None),
    ([running("s2", 0)], "s1", 60, LIMITS, "max-concurrent", 300),
    ([running("s1", 0)], "s1", 60, LIMITS, "in-flight", None),
    ([done("s2", 0, minutes=2)], "s1", 300, LIMITS, "min-interval", 600),
    ([done("s2", 0, minutes=2)], "s1", 600, LIMITS, "ok", None),
    ([done("s2", 0, 1), done("s3", 900, 1), done("s4", 1800, 1)], "s1", 2700, LIMITS, "max-per-hour", HOUR),
    ([done("s2", 0, 1), done("s3", 900, 1), done("s4", 1800, 1)], "s1", HOUR, LIMITS, "ok", None),
    ([done("s1", 0, 5)], "s1", 1800, LIMITS, "cooldown", 300 + HOUR),
    ([done("s1", 0, 5)], "s1", 300 + HOUR, LIMITS, "ok", None),
    # other fleets do not count against this one
    ([running("x1", 0, fleet="other")], "s1", 60, LIMITS, "ok", None),
    # two at once when allowed
    ([running("s2", 0)], "s1", 600, BudgetLimits(2, 0, None, 0), "ok", None),
    ([running("s2", 0), running("s3", 10)], "s1", 60, BudgetLimits(2, 0, None, 0), "max-concurrent", 300),
    # a planned restart later than t also keeps its spacing
    ([done("s2", 900, 5)], "s1", 600, LIMITS, "min-interval", 1500),
    # ...and its hour: 3 planned in the hour up to 3000 leave no room at 1000
    ([done("s2", 1200, 1), done("s3", 2100, 1), done("s4", 3000, 1)], "s1", 0, LIMITS, "max-per-hour", 3000),
    # no limits at all but the in-flight rule
    ([done(f"s{i}", 0, 1) for i in range(2, 6)], "s1", 1, BudgetLimits(5, 0, None, 0), "ok", None),
]


@pytest.mark.parametrize("history, instance, t, limits, code, retry", CASES)
def test_admit_table(history, instance, t, limits, code, retry):
    state = BudgetState(history, now=T0 + t, assumed_duration=300)
    decision = admit(state, "ranker", instance, T0 + t, limits)
    assert decision.code == code, decision.reason
    assert decision.ok == (code == "ok")
    if retry is None:
        assert decision.retry_at is None
    else:
        assert decision.retry_at == pytest.approx(T0 + retry)
    assert decision.reason  # every verdict says why


def test_reasons_name_the_limit_and_the_culprit():
    state = BudgetState([running("serving-3", 0)], now=T0 + 60)
    decision = admit(state, "ranker", "serving-7", T0 + 60, LIMITS)
    assert "serving-3" in decision.reason and "max_concurrent is 1" in decision.reason
    state = BudgetState([done("serving-7", 0)], now=T0 + 900)
    decision = admit(state, "ranker", "serving-7", T0 + 900, LIMITS)
    assert "cooldown is 1h" in decision.reason


def test_overdue_in_flight_restart_still_counts_now():
    """A restart running longer than assumed is still in flight: no second one beside it."""
    state = BudgetState([running("s2", 0)], now=T0 + 3 * HOUR, assumed_duration=300)
    assert admit(state, "ranker", "s1", T0 + 3 * HOUR, LIMITS).code == "max-concurrent"


def test_earliest_start_walks_past_every_limit():
    history = [done("s2", 0, 1), done("s3", 700, 1), done("s4", 1400, 1), done("s1", -3000, 1)]
    state = BudgetState(history, now=T0 + 1500)
    t, why, fleet_wide, code = earliest_start(state, "ranker", "s1", T0 + 1500, LIMITS, Windows())
    # per hour: the 3 starts at 0, 700, 1400 -> next at 3600; cooldown of s1 ended at -2940+3600=660
    assert t == pytest.approx(T0 + HOUR)
    assert why is not None and code in ("max-per-hour", "min-interval") and fleet_wide
    assert admit(state, "ranker", "s1", t, LIMITS).ok


def test_earliest_start_is_infinite_for_an_instance_in_flight():
    state = BudgetState([running("s1", 0)], now=T0)
    t, _, fleet_wide, code = earliest_start(state, "ranker", "s1", T0, LIMITS, Windows())
    assert t == math.inf and code == "in-flight" and not fleet_wide


def test_copy_is_independent():
    state = BudgetState([], now=T0)
    clone = state.copy()
    clone.add(running("s1", 0))
    assert admit(state, "ranker", "s2", T0 + 1, LIMITS).ok
    assert not admit(clone, "ranker", "s2", T0 + 1, LIMITS).ok


@pytest.mark.parametrize(
    "kwargs",
    [{"max_concurrent": 0}, {"max_per_hour": 0}, {"min_interval": -1}, {"cooldown": -5}],
)
def test_limits_refuse_nonsense(kwargs):
    with pytest.raises(ValueError):
        BudgetLimits(**kwargs)


def test_gap_is_the_tightest_long_run_spacing():
    assert BudgetLimits(1, 600, 6, 0).gap(300) == 600
    assert BudgetLimits(1, 60, None, 0).gap(300) == 300  # one at a time, 5 min each
    assert BudgetLimits(4, 0, 120, 0).gap(300) == 75
    assert BudgetLimits(50, 0, None, 0).gap(300) == 6


@settings(max_examples=200, deadline=None)
@given(
    starts=st.lists(st.integers(0, 4 * 3600), max_size=25),
    durations=st.lists(st.integers(1, 900), min_size=25, max_size=25),
    c=st.integers(1, 3),
    gap=st.integers(0, 900),
    hourly=st.one_of(st.none(), st.integers(1, 10)),
    t=st.integers(0, 5 * 3600),
)
def test_property_admitted_start_respects_every_limit(starts, durations, c, gap, hourly, t):
    limits = BudgetLimits(c, gap, hourly, 0)
    records = [
        RestartRecord(f"s{i}", "f", "a", T0 + s, T0 + s + durations[i], "succeeded")
        for i, s in enumerate(starts)
    ]
    state = BudgetState(records, now=T0)
    when, *_ = earliest_start(state, "f", "new", T0 + t, limits, Windows())
    assert when >= T0 + t
    running_then = [r for r in records if r.started_at <= when < r.finished_at]
    assert len(running_then) < c
    assert all(abs(r.started_at - when) >= gap - 1e-6 for r in records)
    if hourly is not None:  # no sliding hour holding `when` gets more than `hourly` starts
        starts = sorted([r.started_at for r in records] + [when])
        for x in starts:
            if when <= x < when + HOUR:
                assert sum(1 for s in starts if x - HOUR < s <= x) <= hourly
