"""The leak and oom-risk detectors on synthetic shapes: what must not fire, and what must."""

from __future__ import annotations

import random

import pytest

from agent.detect import analyze_instance, evaluate
from agent.guardrail.growth import judge_series
from support.detect_shapes import DAY, PARAMS, SCALE, T0, cut_at_oom, kinds, oom_time, series

HEALTHY = {
    "flat": {},
    "gc sawtooth": {"saw": 0.3, "saw_period": 3},
    "daily cycle": {"season": 0.06, "days": 8},
    "model reload step": {"step_at_day": 3.3},
    "long batch bursts": {"bursts": [(2.2, 1.5, 0.3), (3.5, 0.5, 0.4), (4.1, 2.0, 0.25)]},
    "warm-up plateau": {"warmup_depth": 0.4, "warmup_tau_h": 1.5, "restarts_days": [2.3, 4.1]},
    "restarts": {"restarts_days": [1.5, 3.2, 4.7], "warmup_depth": 0.5, "warmup_tau_h": 0.3},
}


@pytest.mark.parametrize("shape", HEALTHY)
def test_healthy_shapes_open_no_finding(shape):
    result = analyze_instance(series(**HEALTHY[shape]), PARAMS)
    assert result.findings == [], [f.summary for f in result.findings]


def test_a_fast_leak_is_found_hours_before_its_oom_with_a_time_to_oom():
    s = series(leak_pct_h=3, onset_day=4.2, days=6)
    oom = oom_time(s)
    result = analyze_instance(cut_at_oom(s), PARAMS)
    leak = next(f for f in result.findings if f.kind == "leak")
    onset = T0 + 4.2 * DAY
    assert onset < leak.opened_at < oom - 2 * PARAMS.step
    assert leak.verdict == "leak"
    assert leak.severity in ("error", "critical")
    e = leak.evidence
    assert e["series"] == "rss_bytes"
    assert e["slope_bytes_per_second"] > 0 and 1.5 < e["pct_per_hour"] / SCALE < 6  # %/h of a compressed hour
    assert e["confidence"] >= PARAMS.confidence
    assert 0 < e["time_to_oom_seconds"] < PARAMS.horizon
    assert "oom-risk" in kinds(result.findings)


def test_a_slow_leak_is_found_days_before_its_oom():
    s = series(leak_pct_h=0.3, onset_day=3.5, days=10)
    oom = oom_time(s)
    result = analyze_instance(cut_at_oom(s), PARAMS)
    leak = next(f for f in result.findings if f.kind == "leak")
    assert T0 + 3.5 * DAY < leak.opened_at < oom - 2 * DAY
    assert result.at_open[leak.id].severity == "warning"  # when it opened, the OOM was days away
    assert leak.severity == "critical"  # and it escalated as the OOM came near


def test_a_leak_in_the_first_day_is_found_before_its_oom_even_without_history():
    s = series(leak_pct_h=4, onset_day=0.5, days=3)
    oom = oom_time(s)
    result = analyze_instance(cut_at_oom(s), PARAMS)
    leak = next(f for f in result.findings if f.kind == "leak")
    assert leak.opened_at < oom


def test_a_leak_across_restarts_is_judged_per_lifetime_and_a_restart_resolves_it():
    s = series(leak_pct_h=3, onset_day=4.0, days=7, restarts_days=[5.0], limit=4 * 2**30)
    result = analyze_instance(s, PARAMS)
    leaks = [f for f in result.findings if f.kind == "leak"]
    assert leaks, "the leak must be found"
    first = leaks[0]
    assert first.resolved_at is not None and first.resolved_at >= T0 + 5.0 * DAY
    assert all(f.opened_at > T0 + 4.0 * DAY for f in leaks)


def test_a_leak_without_a_known_limit_still_opens_and_oom_risk_says_it_cannot_judge():
    s = series(leak_pct_h=0.5, onset_day=3.5, days=9, limit=None)
    result = analyze_instance(s, PARAMS)
    assert "leak" in kinds(result.findings)
    assert "oom-risk" not in kinds(result.findings)
    assert any(note.startswith("oom-risk: no memory limit known") for note in result.notes)


def test_evaluate_names_what_it_cannot_judge_in_a_young_lifetime():
    s = series(days=0.05)
    observations = {o.kind: o for o in evaluate(s, T0 + 0.05 * DAY, PARAMS)}
    assert observations["leak"].state == "unknown"
    assert "not enough data" in observations["leak"].summary
    assert observations["fragmentation"].state == "unknown"


@pytest.mark.parametrize("confident", [True, False])
def test_a_held_leak_observation_does_not_deny_the_growth_it_shows(confident):
    """45 s of growth sampled with its first and last seconds missing: the fits cover less than they
    must to project, so the detector holds; its summary says so, not "no steady growth"."""
    rng, start, mib = random.Random(0), 1_000_000.0, 2**20
    points, x = [], 1.5
    while x < 43.5:
        points.append((start + x, 75 * mib + (mib if confident else 0.0) * x + rng.gauss(0, 0.3 * mib)))
        x += 0.25 if rng.random() > 0.4 else rng.uniform(1, 4)
    [leak] = [o for o in judge_series({"rss_bytes": points}, start, start + 45) if o.kind == "leak"]
    assert leak.state != "firing"
    if confident:
        assert leak.evidence["confidence"] >= 0.995
        assert "no steady growth" not in leak.summary
        assert "but is not yet a leak: " in leak.summary, leak.summary
    else:
        assert "not yet a leak" not in leak.summary, leak.summary
