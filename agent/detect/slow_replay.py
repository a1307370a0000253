"""The slow detector replayed over recorded series, as the agent would have judged them.

`medic analyze` gives the latency series of its input (`latency_p99_seconds` and the other
quantiles, or the canary's) to `analyze_slow`: on the slow detector's epoch-aligned grid, each
fleet of peers is judged by `evaluate_slow` with the samples the agent's detection job would have
loaded at that instant (the last `agent.detect.slow.history` seconds), and the observations go
through the same lifecycle (`open_after`, `resolve_after`). The findings are added to each
instance's `InstanceAnalysis`, so the table and `--json` list them beside the memory findings.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence

from agent.detect.engine import InstanceAnalysis
from agent.detect.latency_rules import CANARY, QUANTILE_METRICS, Slo, SlowParams
from agent.detect.lifecycle import update
from agent.detect.model import START_TIME, Finding, InstanceSeries, Points
from agent.detect.slow import DEFAULT_SLOW, INPUT_METRICS, evaluate_slow, history, tick_for

LATENCY_METRICS = frozenset({*QUANTILE_METRICS.values(), CANARY})


def has_latency(series: InstanceSeries) -> bool:
    return any(series.series.get(metric) for metric in LATENCY_METRICS)


class _Window:
    """One instance's slow-detector inputs, cut to what the agent loads for a judgement at `tick`."""

    def __init__(self, series: InstanceSeries) -> None:
        self.series = series
        self.metrics = {m: p for m, p in series.series.items() if m in INPUT_METRICS and p}
        self.times = {m: [ts for ts, _ in points] for m, points in self.metrics.items()}
        self.first = min(points[0][0] for points in series.series.values() if points)

    def at(self, since: float, tick: float) -> InstanceSeries:
        cut: dict[str, Points] = {}
        for metric, points in self.metrics.items():
            times = self.times[metric]
            lo, hi = bisect_left(times, since), bisect_right(times, tick)
            if hi > lo:
                cut[metric] = points[lo:hi]
        restarts = [r for r in self.series.restarts or [] if r <= tick] or None
        if restarts is None and START_TIME not in cut:
            # the process began at the first sample of the whole input, not of the window: the
            # agent's own window reaches back days (its memory history) for the same answer
            restarts = [self.first]
        return InstanceSeries(
            self.series.instance, cut, restarts=restarts, memory_limit=self.series.memory_limit
        )


def analyze_slow(
    fleets: Sequence[Sequence[InstanceSeries]],
    analyses: Mapping[str, InstanceAnalysis],
    params: SlowParams = DEFAULT_SLOW,
    *,
    slos: Mapping[str, Slo | None] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> int:
    """Replay the slow detector over each fleet (peers of one another) and add its findings to the
    instances' analyses; returns the number of judgements made (0: no latency in the input)."""
    slos = slos or {}
    span = history(params, slos)
    judged = 0
    groups = [[s for s in fleet if has_latency(s)] for fleet in fleets]
    groups = [group for group in groups if group]
    for number, members in enumerate(groups, 1):
        windows = [_Window(series) for series in members]
        first = min(min(points[0][0] for points in w.metrics.values()) for w in windows)
        last = max(max(points[-1][0] for points in w.metrics.values()) for w in windows)
        active: list[Finding] = []
        opened: dict[str, Finding] = {}
        at_open: dict[str, Finding] = {}
        tick = tick_for(first, params) + params.step
        while tick <= last + 1e-9:
            fleet = [w.at(tick - span, tick) for w in windows]
            observations = evaluate_slow(fleet, tick, params, slos=slos)
            judged += 1
            active, transitions = update(active, observations, params)  # type: ignore[arg-type]
            for change in transitions:
                opened[change.finding.id] = change.finding
                if change.change == "opened":
                    at_open[change.finding.id] = change.finding
            tick += params.step
        for finding in active:
            if finding.state == "open":
                opened[finding.id] = finding
        for finding in opened.values():
            analysis = analyses.get(finding.instance)
            if analysis is None:
                continue
            analysis.findings.append(finding)
            if finding.id in at_open:
                analysis.at_open[finding.id] = at_open[finding.id]
        if progress is not None:
            progress(number, len(groups))
    for analysis in analyses.values():
        analysis.findings.sort(key=lambda f: (f.opened_at or math.inf, f.kind))
    return judged
