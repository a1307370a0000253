"""Each build's memory growth in a run: medic's leak detector on the run's compressed time scale, on
the requests' clock, beside a robust slope of the lower envelope.

The compressed scale: the detector is given the measurement as one process lifetime of D seconds
with its main window D/2, its long window D, a "season" of D/3 (growth must set a record in the
last third, not only drift), no warm-up (the run's warm-up phase is not in the series), and a
trend confidence of 0.995. It judges once, at the end, as `medic analyze` would at that tick.

The detector reads each build's samples on the requests' clock: a sample's time is where the
build's answered requests had reached, the run's D seconds spread evenly over them. A build grows
with the work it does, so when a busy machine stalls the server, the load or the sampler for a
few seconds (no request answered), its memory holds flat on the wall clock and those flat
stretches would read as growth that levels off; on the requests' clock they take no time. The
rates the verdicts print and compare are still bytes per wall-clock second.

A warm-up step in the first seconds followed by steady growth fits the detector's levelling curve
on this scale; where the detector says "levelling off" with its full confidence, the growth still
counts when every round grows at over half the rate of the fastest (`steady_in_rounds`), since a
working set that levels grows in the first round only. So does growth the detector sees with its
full confidence but holds unconfirmed: on a loaded machine samples go missing at the ends of the
run, its fits then cover a bucket less than the window they must span, and the rounds are the
run's own second view of the trend.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any

from agent.core.units import format_bytes
from agent.detect.memory.engine import evaluate
from agent.detect.memory.saturation import RATE_RATIO
from agent.detect.model import InstanceSeries, Observation
from agent.detect.params import DetectParams
from agent.guardrail.measure import BuildSeries
from agent.guardrail.stats import lower_envelope, theil_sen

# the trend confidence the detector needs in a run: one lifetime under constant load, with no daily
# cycle to mistake for growth, and the baseline beside it; its 0.999 is for hours of production data
DETECTOR_CONFIDENCE = 0.995
MIN_POINTS = 12  # samples in the run, and requests answered, that a growth stands on
ROUND_BUCKETS = 12  # the lower envelope of one round


def detector_params(duration: float) -> DetectParams:
    """The leak detector compressed onto a run of `duration` seconds (see the module doc)."""
    return DetectParams(
        window=duration / 2,
        long_window=duration,
        horizon=duration,
        warmup=0.0,
        season=duration / 3,
        season_days=3,
        gap=duration,
        confidence=DETECTOR_CONFIDENCE,
    )


@dataclass(slots=True)
class Growth:
    metric: str
    firing: bool
    confidence: float
    slope: float  # bytes a second, Theil-Sen over the lower envelope (24 buckets)
    detector_slope: float | None
    summary: str
    level: float | None
    per_round: list[float]  # the same slope within each round, in order

    def to_dict(self) -> dict[str, Any]:
        return {
            "series": self.metric,
            "detector": "firing" if self.firing else "not firing",
            "detector_summary": self.summary,
            "detector_confidence": round(self.confidence, 6),
            "slope_bytes_per_second": self.slope,
            "slope_per_minute": format_bytes(self.slope * 60) + "/min",
            "detector_slope_bytes_per_second": self.detector_slope,
            "level_bytes": self.level,
            "round_slopes_bytes_per_second": self.per_round,
        }


def on_requests_clock(
    build: BuildSeries, points: list[tuple[float, float]], start: float, end: float
) -> list[tuple[float, float]]:
    """`points` within [start, end] with their times moved to the build's requests' clock (see the
    module doc) between its first and last sample, which keep their times; a stall's samples become
    one point, its lowest. Unchanged when too few requests were answered to make a clock of them."""
    answered = [(t, n) for t, n in build.answered if start <= t <= end]
    if len(answered) < MIN_POINTS or answered[-1][1] - answered[0][1] < MIN_POINTS:
        return [p for p in points if start <= p[0] <= end]
    times = [t for t, _ in answered]
    first, total = answered[0][1], answered[-1][1] - answered[0][1]
    begin, span = times[0], times[-1] - times[0]  # the first and last samples stay where they were
    moved: dict[float, float] = {}
    for t, v in points:
        if not start <= t <= end:
            continue
        i = min(bisect_left(times, t), len(times) - 1)
        at = begin + span * (answered[i][1] - first) / total
        moved[at] = min(v, moved.get(at, v))
    return sorted(moved.items())


def judge_series(points: dict[str, list[tuple[float, float]]], start: float, end: float) -> list[Observation]:
    """The detector's observations on `points` (unix ts), rebased onto its grid at the end of the run."""
    duration = end - start
    params = detector_params(duration)
    origin = round(1e6 / params.step) * params.step
    rebased = {
        metric: [(origin + (t - start), v) for t, v in pts if start <= t <= end]
        for metric, pts in points.items()
    }
    series = InstanceSeries("candidate", rebased, restarts=[], started_at=origin)
    return evaluate(series, origin + duration + 1e-6, params)


def growth(
    build: BuildSeries, metric: str, start: float, end: float, rounds: list[tuple[float, float, int]]
) -> Growth | None:
    """The build's growth of `metric` over the run, judged by the detector, with its slope over the
    run and within each of the `rounds` (start, end, first)."""
    points = build.points(metric)
    if len([p for p in points if start <= p[0] <= end]) < MIN_POINTS:
        return None
    work = on_requests_clock(build, points, start, end)
    leak = next(o for o in judge_series({metric: work}, start, end) if o.kind == "leak")
    envelope = lower_envelope(points, start, end, 24)
    slope = theil_sen(envelope)
    found = leak.evidence.get("confidence")
    confidence = float(found) if isinstance(found, (int, float)) else 0.0
    per_round = [theil_sen(lower_envelope(points, a, b, ROUND_BUCKETS)) for a, b, _ in rounds]
    firing, summary = leak.state == "firing", leak.summary
    plateau = leak.verdict == "working-set-plateau"
    if (
        (plateau or leak.state == "holding")
        and confidence >= DETECTOR_CONFIDENCE
        and steady_in_rounds(per_round)
    ):
        firing = True
        shown = ", ".join(format_bytes(r) + "/s" for r in per_round)
        why = (
            "a step at the start, not a level reached"
            if plateau
            else "the rounds confirm the detector's trend"
        )
        summary = f"{metric} grows round after round ({shown}): {why}"
    return Growth(
        metric,
        firing,
        confidence,
        slope,
        leak.evidence.get("slope_bytes_per_second"),
        summary,
        envelope[-1][1] if envelope else None,
        per_round,
    )


def steady_in_rounds(per_round: list[float]) -> bool:
    """Growth that goes on through the run: every round grows at over `RATE_RATIO` of the fastest.
    On the run's compressed scale a warm-up step in the first seconds, then steady growth, fits a
    levelling curve; a working set that levels grows in the first round only."""
    return len(per_round) >= 2 and min(per_round) > 0 and min(per_round) >= RATE_RATIO * max(per_round)
