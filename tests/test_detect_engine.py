"""The online path (`evaluate` + `update` on a schedule) and the offline replay (`analyze`) agree."""

from __future__ import annotations

import math

import pytest

from agent.detect import InstanceSeries, analyze, analyze_instance, evaluate, tick_for, update
from agent.detect.memory.engine import judge
from agent.detect.memory.prepared import Prepared
from support.detect_shapes import DAY, PARAMS, T0, cut_at_oom, series


def _online(s: InstanceSeries, cadence: float, history: float | None = None):
    """What the agent would do: every `cadence` seconds, judge the history it has, then update."""
    points = s.series["rss_bytes"]
    active, transitions = [], []
    end = points[-1][0]
    schedule = [points[0][0] + cadence * k for k in range(1, int((end - points[0][0]) / cadence) + 1)] + [end]
    for now in schedule:
        since = now - history if history is not None else -math.inf
        seen = [p for p in points if since <= p[0] <= now]
        restarts = [r for r in s.restarts or [] if r <= now]
        view = InstanceSeries(
            s.instance,
            {"rss_bytes": seen},
            restarts=[r for r in restarts if r > since],
            memory_limit=s.memory_limit,
            started_at=max([points[0][0], *[r for r in restarts if r <= since]]),  # the tracker knows it
        )
        observations = evaluate(view, now, PARAMS)
        active, new = update(active, observations, PARAMS)
        transitions += new
    return transitions


def _key(transitions):
    return [
        (t.change, t.ts, t.finding.id, t.finding.kind, t.finding.severity, t.finding.verdict)
        for t in transitions
    ]


@pytest.mark.parametrize(
    "shape",
    [
        {"leak_pct_h": 3, "onset_day": 3.3, "days": 5, "restarts_days": [4.5], "limit": 4 * 2**30},
        {"leak_pct_h": 4, "onset_day": 0.3, "days": 1.2},
        {"bursts": [(0.5, 1.0, 0.3)], "step_at_day": 0.8, "days": 1.5, "warmup_depth": 0.4},
    ],
)
def test_the_online_path_finds_what_the_replay_finds_at_the_same_times(shape):
    s = cut_at_oom(series(**shape))
    offline = _key(analyze_instance(s, PARAMS).transitions)
    # the agent's schedule is not the judgement grid: a 25 s cadence (a tick is 60 s here)
    online = _key(_online(s, cadence=25.0, history=PARAMS.history))
    assert online == offline
    assert shape.get("leak_pct_h") is None or any(change == "opened" for change, *_ in offline)


def test_online_and_replay_agree_over_days_with_a_daily_cycle_and_a_slow_leak():
    """Long and daily fits (cached per long bucket), the daily profile and the `history` cut."""
    s = cut_at_oom(series(season=0.05, leak_pct_h=0.6, onset_day=8.3, days=9.6, limit=2.6 * 2**30))
    offline = _key(analyze_instance(s, PARAMS).transitions)
    assert any(change == "opened" for change, *_ in offline)
    assert _key(_online(s, cadence=37.0, history=PARAMS.history)) == offline


def test_a_replay_of_many_instances_equals_one_replay_each():
    fleet = [
        series(seed=i, days=1.5, leak_pct_h=4 if i % 2 else 0, onset_day=0.3, name=f"i{i}") for i in range(4)
    ]
    together = analyze(fleet, PARAMS)
    alone = [analyze_instance(s, PARAMS) for s in fleet]
    assert [_key(a.transitions) for a in together] == [_key(a.transitions) for a in alone]
    assert [a.instance for a in together] == ["i0", "i1", "i2", "i3"]


def test_evaluate_ignores_samples_after_the_last_judgement_instant():
    s = series(leak_pct_h=3, onset_day=0.2, days=1)
    now = T0 + 0.8 * DAY + 17
    later = InstanceSeries(
        s.instance, {"rss_bytes": [p for p in s.series["rss_bytes"] if p[0] <= now]}, [], s.memory_limit
    )
    cut = InstanceSeries(
        s.instance,
        {"rss_bytes": [p for p in s.series["rss_bytes"] if p[0] < tick_for(now, PARAMS)]},
        [],
        s.memory_limit,
    )
    assert [o.to_dict() for o in evaluate(later, now, PARAMS)] == [
        o.to_dict() for o in evaluate(cut, now, PARAMS)
    ]


def test_the_replay_reports_first_fired_times_and_what_it_could_not_judge():
    result = analyze_instance(cut_at_oom(series(leak_pct_h=4, onset_day=0.3, days=1.2)), PARAMS)
    assert result.first_fired("leak") is not None and result.first_fired("leak") > T0 + 0.3 * DAY
    doc = result.to_dict()
    assert doc["findings"][0]["at_open"]["evidence"]["confidence"] >= PARAMS.confidence
    assert any("fragmentation" in note for note in doc["notes"])


@pytest.mark.parametrize("leak_pct_h", [0, 4])
def test_a_judgement_again_at_the_same_tick_says_what_a_fresh_one_says(leak_pct_h):
    """A replay judges a quiet instance again, in full, when its fleet's evidence reads it: the
    second judgement reuses the first one's fits and must say what a judgement from scratch says."""
    s = series(days=1.5, leak_pct_h=leak_pct_h, onset_day=0.3)
    prep = Prepared(s, PARAMS)
    for tick in [T0 + k * PARAMS.step for k in range(8, int(1.5 * DAY / PARAMS.step))]:
        judge(prep, tick, skip_quiet=True)
        again = judge(prep, tick)
        fresh = judge(Prepared(s, PARAMS), tick)
        assert [(o.kind, o.state, o.severity, o.summary) for o in again] == [
            (o.kind, o.state, o.severity, o.summary) for o in fresh
        ]
        assert again[0].state != "unknown"
