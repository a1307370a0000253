"""What a finding says about the limit is what is true: peaks past a limit set only in medic's config
are above it (the kernel does not enforce it: the time to OOM is unknown), never "not projected to
reach" it; at an enforced limit the time to OOM is 0; and the findings of a process that is gone
resolve as soon as its new process is seen, so no view shows the old process's time to OOM."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.detect import InstanceSeries, evaluate, update
from agent.detect.lifecycle import earlier_process, past_the_limit, restarted
from support.detect_shapes import PARAMS, T0, GiB, series


def judged(limit_source: str | None, base: float = 3.5 * GiB, limit: float = 3 * GiB, days: float = 0.5):
    """The oom-risk and leak observations of a flat process whose peaks sit at `base` against `limit`."""
    s: InstanceSeries = series(days=days, base=base, limit=limit, saw=0.0)
    s.limit_source = limit_source
    now = s.series["rss_bytes"][-1][0]
    found = {o.kind: o for o in evaluate(s, now, PARAMS)}
    return found["oom-risk"], found["leak"]


def test_peaks_past_a_config_only_limit_are_above_it_with_no_time_to_oom():
    oom, leak = judged("config")
    assert oom.state == "firing" and oom.severity == "error"
    assert "are above its memory limit 3.0 GiB" in oom.summary and "not projected" not in oom.summary
    assert "the kernel does not enforce" in oom.summary and "runs on past it" in oom.summary
    assert oom.evidence["above_limit"] is True and oom.evidence["limit_source"] == "config"
    assert oom.evidence["time_to_oom_seconds"] is None  # when the kernel would kill it is not known
    assert leak.state != "firing"  # flat: no leak, and nothing here calls the limit unreached


@pytest.mark.parametrize("source, words", [("cgroup", "its cgroup"), ("host", "the host"), (None, "")])
def test_peaks_at_an_enforced_or_unknown_limit_have_reached_it_now(source, words):
    oom, _ = judged(source)
    assert oom.state == "firing" and oom.severity == "critical"
    assert "have reached its memory limit" in oom.summary and words in oom.summary
    assert oom.evidence["time_to_oom_seconds"] == 0.0 and oom.evidence["above_limit"] is True


def test_peaks_below_the_limit_are_judged_as_before():
    oom, _ = judged("config", base=2 * GiB)
    assert oom.state == "clear" and "not projected to reach" in oom.summary
    assert "above_limit" not in oom.evidence


def test_a_leak_past_a_config_only_limit_says_so_and_reports_no_time_to_oom():
    s = series(days=2, base=2 * GiB, limit=2.2 * GiB, leak_pct_h=4, onset_day=0.2, saw=0.01)
    s.limit_source = "config"
    now = s.series["rss_bytes"][-1][0]
    leak = next(o for o in evaluate(s, now, PARAMS) if o.kind == "leak")
    assert leak.state == "firing", leak.summary
    assert "already at or above its limit" in leak.summary and "projected OOM in" not in leak.summary
    assert leak.evidence["time_to_oom_seconds"] is None and leak.evidence["above_limit"] is True


def test_the_findings_of_a_process_that_is_gone_resolve_when_its_successor_is_seen():
    oom, _ = judged("cgroup")
    opened, _ = update([], [oom], PARAMS)  # critical: opens at once
    assert [f.state for f in opened] == ["open"]
    life = oom.lifetime_start
    assert not earlier_process("x", life, {"x": life + 0.5})  # the same process (a clock tick apart)
    kept, transitions = restarted(opened, {"x": life + 0.5}, T0 + 100)
    assert kept == opened and transitions == []
    kept, transitions = restarted(opened, {"other": life + 600}, T0 + 100)
    assert kept == opened and transitions == []
    kept, transitions = restarted(opened, {"x": life + 600}, T0 + 100)
    assert kept == [] and [(t.change, t.reason) for t in transitions] == [
        ("resolved", "the process restarted")
    ]
    pending = [replace(opened[0], state="pending")]
    assert restarted(pending, {"x": life + 600}, T0 + 100) == ([], [])  # dropped, as the lifecycle does


def test_a_leak_finding_stops_counting_down_once_the_peaks_are_past_the_limit():
    """Its projection ("OOM in 0.5s", from its last firing judgement) has come; the oom-risk finding
    judged now says the peaks are past a config-only limit: the leak finding says the same."""
    oom, _ = judged("config")
    leak = replace(
        oom,
        kind="leak",
        summary="x leaks 1.0 GiB/h (3.00 %/h) in rss_bytes; projected OOM "
        "in 0.5s against 3.0 GiB; confidence 1.000",
        evidence={"time_to_oom_seconds": 0.5},
    )
    findings, _ = update([], [oom, leak], replace(PARAMS, open_after=1))
    (now_leak,) = [f for f in past_the_limit(findings) if f.kind == "leak"]
    assert now_leak.evidence["time_to_oom_seconds"] is None and now_leak.evidence["above_limit"]
    assert now_leak.summary == (
        "x leaks 1.0 GiB/h (3.00 %/h) in rss_bytes; its peaks have since reached its limit 3.0 GiB; "
        "confidence 1.000"
    )
    below, _ = judged("config", base=2 * GiB)
    findings, _ = update([], [below, leak], replace(PARAMS, open_after=1))
    assert past_the_limit(findings) == findings  # below the limit: its own projection stands
