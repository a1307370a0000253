"""The replays skip the ticks that see no sample (`agent.detect.coverage`): the spans are those a
plain scan finds, and a replay that skips finds exactly what one judging every tick finds, over
series with gaps, restarts and strays decades away, memory and latency alike."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.cli.main import main
from agent.detect import InstanceSeries, analyze_instance
from agent.detect.coverage import Sight, sample_spans, seen_from, steps_seen, union
from agent.detect.memory import fleet as fleet_module
from agent.detect.memory.engine import judged_reach
from agent.detect.memory.fleet import analyze_fleet
from agent.detect.memory.prepared import Prepared
from agent.detect.model import InstanceAnalysis
from agent.detect.slow.replay import analyze_slow
from support.detect_shapes import DAY, HOUR, PARAMS, T0, series

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
times = st.lists(st.floats(0, 1e4, allow_nan=False), max_size=60).map(sorted)


def _plain_spans(points, gap):
    spans = []
    for ts, _ in points:
        if spans and ts - spans[-1][1] <= gap:
            spans[-1] = (spans[-1][0], ts)
        else:
            spans.append((ts, ts))
    return spans


@given(ts=times, gap=st.floats(0, 2e3, allow_nan=False))
def test_the_spans_are_those_a_scan_of_every_point_finds(ts, gap):
    points = [(t, 0.0) for t in ts]
    assert sample_spans(points, gap) == _plain_spans(points, gap)
    assert sample_spans(ts, gap, key=None) == _plain_spans(
        points, gap
    )  # bare times, as the slow replay has them


@given(
    series=st.lists(times, max_size=4),
    back=st.floats(1, 500),
    ahead=st.floats(0, 100),
    instants=st.lists(st.floats(-1e3, 1.2e4, allow_nan=False), max_size=40).map(sorted),
)
def test_an_instant_is_seen_exactly_when_a_sample_is_within_its_reach(series, back, ahead, instants):
    points = [[(t, 0.0) for t in ts] for ts in series]
    sight = Sight(seen_from(points, back, ahead))
    slack = 1e-6  # at the very edge of a reach, rounding may go either way
    for t in instants:
        if any(t - back + slack <= s <= t + ahead - slack for ts in series for s in ts):
            assert sight.sees(t), t
        elif not any(t - back - slack <= s <= t + ahead + slack for ts in series for s in ts):
            assert not sight.sees(t), t


@given(intervals=st.lists(st.tuples(st.floats(-50, 500), st.floats(0, 80)), max_size=6))
def test_the_steps_seen_are_every_step_inside_an_interval_once_in_order(intervals):
    merged = union((lo, lo + length) for lo, length in intervals)
    steps = list(steps_seen(merged, 7.0, 0, 60))
    assert steps == sorted(set(steps)) and all(0 <= k <= 60 for k in steps)
    inside = {k for k in range(61) if any(lo <= 7.0 * k <= hi for lo, hi in merged)}
    assert inside <= set(steps)


def _summary(result):
    return [(f.id, f.kind, f.verdict, f.opened_at, f.resolved_at, f.severity) for f in result.findings], [
        (t.change, t.finding.id, t.ts) for t in result.transitions
    ]


def _with_gaps(s: InstanceSeries, gaps: list[tuple[float, float]]) -> InstanceSeries:
    """`s` without its samples in each `(start day, length h)` gap: a process stopped, an agent away."""

    def kept(ts: float) -> bool:
        return not any(T0 + d * DAY <= ts < T0 + d * DAY + h * HOUR for d, h in gaps)

    return replace(s, series={m: [p for p in points if kept(p[0])] for m, points in s.series.items()})


GAPS = st.lists(st.tuples(st.floats(0.2, 2.5), st.floats(0.5, 30)), max_size=3)
SHAPES = st.sampled_from(
    [{}, {"leak_pct_h": 4, "onset_day": 0.3}, {"leak_pct_h": 8}, {"season": 0.05}, {"restarts_days": [1.2]}]
)


@FAST
@given(shape=SHAPES, gaps=GAPS, seed=st.integers(0, 1000))
def test_skipping_unseen_ticks_changes_no_finding_of_one_instance(shape, gaps, seed):
    s = _with_gaps(series(days=3, seed=seed, **shape), gaps)
    if not s.series["rss_bytes"]:
        return
    assert _summary(analyze_instance(s, PARAMS)) == _summary(analyze_instance(s, PARAMS, every_tick=True))


@FAST
@given(fleet=st.lists(st.tuples(SHAPES, GAPS), min_size=2, max_size=4), seed=st.integers(0, 1000))
def test_skipping_unseen_ticks_changes_no_finding_of_a_fleet(fleet, seed):
    members = [
        _with_gaps(series(days=3, seed=seed + n, name=f"i{n}", **shape), gaps)
        for n, (shape, gaps) in enumerate(fleet)
    ]
    members = [m for m in members if m.series["rss_bytes"]]
    skipping = fleet_module._replay([Prepared(m, PARAMS) for m in members], PARAMS)
    every = fleet_module._replay([Prepared(m, PARAMS) for m in members], PARAMS, every_tick=True)
    assert [_summary(a) for a in skipping] == [_summary(a) for a in every]


def test_a_stray_sample_decades_before_judges_no_more_ticks_than_without_it(monkeypatch):
    """A clock that read 1990 for one sample: the replay does not judge the 36 years between, and
    finds what judging every tick finds (the stray is an earlier lifetime either way: here one a
    month before, where judging every tick is cheap)."""
    calls = []

    def counted(prep, tick, skip_quiet=False):
        calls.append(tick)
        return judge(prep, tick, skip_quiet)

    judge = fleet_module.judge
    monkeypatch.setattr(fleet_module, "judge", counted)
    clean = series(days=2, leak_pct_h=6)

    def strayed(before: float) -> InstanceSeries:
        return replace(clean, series={"rss_bytes": [(T0 - before, 5.0), *clean.series["rss_bytes"]]})

    analyze_fleet([clean], PARAMS)
    ticks = len(calls)
    calls.clear()
    found = analyze_fleet([strayed(36 * 365 * 86400)], PARAMS)
    back, ahead = judged_reach(PARAMS)
    assert len(calls) <= ticks + (back + ahead) / PARAMS.step + 3  # the stray's own reach at most
    reference = fleet_module._replay([Prepared(strayed(30 * DAY), PARAMS)], PARAMS, every_tick=True)
    assert found[0].findings and _summary(found[0])[0] == _summary(reference[0])[0]


def test_a_stray_latency_sample_decades_before_adds_no_ticks_to_the_slow_replay():
    rng = random.Random(3)
    members = [
        InstanceSeries(
            f"i{n}",
            {"latency_p99_seconds": [(T0 + 60 * i, 0.05 + 0.01 * rng.random()) for i in range(360)]},
        )
        for n in range(3)
    ]
    strayed = [
        replace(
            m,
            series={"latency_p99_seconds": [(T0 - 20 * 365 * 86400, 0.05), *m.series["latency_p99_seconds"]]},
        )
        for m in members
    ]

    def judged(fleet):
        analyses = {m.instance: InstanceAnalysis(m.instance, [], [], [], None, None) for m in fleet}
        return analyze_slow([fleet], analyses)

    assert judged(strayed) <= judged(members) + 2 * math.ceil(3600 / 30)  # the stray's own hour at most


def test_medic_analyze_of_an_input_with_a_1990_sample_reads_as_without_it(tmp_path, capsys):
    """30 hours of minutes leaking 4 %/h towards a 4 GiB limit, once with a sample stamped 1990."""
    start = 1_767_571_200
    lines = [
        json.dumps(
            {
                "ts": start + 60 * i,
                "instance": "svc",
                "metric": "rss_bytes",
                "value": 2**31 * (1 + 0.04 * i / 60),
            }
        )
        for i in range(30 * 60)
    ]
    stray = json.dumps({"ts": 631_152_000, "instance": "svc", "metric": "rss_bytes", "value": 5})
    (tmp_path / "clean.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "stray.jsonl").write_text("\n".join([stray, *lines]) + "\n")
    reports = []
    for name in ("clean", "stray"):
        assert main(["analyze", str(tmp_path / f"{name}.jsonl"), "--limit", "4GiB", "--json"]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    found = [[(f["kind"], f["first_fired"]) for f in r["instances"][0]["findings"]] for r in reports]
    assert found[0] and found[0] == found[1]
