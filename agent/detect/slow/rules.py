"""The slow detector's rules against an SLO, peers and its own trend, and the tunables of all its
rules (the relative rule is in `agent.detect.slow.relative`); `agent.detect.slow.detector` combines them.

Each rule returns a `Rule`: `firing`, `clear`, `holding` (between its firing and clearing
thresholds: keep whatever finding there is) or `unknown` (not enough data), a sentence, and the
figures behind it.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from operator import itemgetter
from typing import Any

from agent.core.timescale import EVIDENCE_SAMPLES, STALE_SAMPLES, WINDOW_SAMPLES, TimeScale
from agent.core.units import format_duration
from agent.detect.model import START_TIME, InstanceSeries, Points, State
from agent.detect.params import setting
from agent.detect.trend import Trend, mann_kendall, median, remove_steps, trend

QUANTILE_METRICS = {
    0.5: "latency_p50_seconds",
    0.9: "latency_p90_seconds",
    0.99: "latency_p99_seconds",
    0.999: "latency_p999_seconds",
}
MEAN = "latency_mean_seconds"  # from a histogram, a summary or a pair of counters: never a quantile
CANARY = "canary_latency_seconds"


@dataclass(frozen=True, slots=True)
class Slo:
    quantile: float = 0.99
    threshold: float = 0.25  # seconds
    window: float = 300.0  # `for`: seconds over the threshold that make an instance slow


def judged_metrics(slo: Slo | None) -> tuple[str, str, str]:
    """The series the slow detector judges, in order of preference: the quantile the SLO names
    (p99 without one), else the mean (what a summary without quantiles or a pair of counters gives),
    else the canary's latency. The first one an instance has is the one judged."""
    return QUANTILE_METRICS.get(slo.quantile if slo else 0.99, QUANTILE_METRICS[0.99]), MEAN, CANARY


RELATIVE_SPAN = 3  # the relative rule looks back this many trend windows...
RELATIVE_POINTS = 12  # ...at this many instants, each the instance's level over its peers' median
RELATIVE_GROWTH = 0.3  # it fires when that ratio grew by 30 % and is 30 % above its usual ratio now:
# the median of this many instants before the window, twice as far apart (two windows' span), or
# the peers' median until those are known
BASELINE_POINTS = 12


@dataclass(frozen=True, slots=True)
class SlowParams:
    step: float = setting(30.0, "span")  # judgement grid, seconds: calls within one step are one judgement
    # a value holds at most this long (the agent re-stores flat values every 60 s)
    stale: float = setting(90.0, "span")
    min_coverage: float = setting(0.8, "figure")  # data must cover this fraction of a window to judge it
    fire_fraction: float = setting(0.9, "figure")  # slo: over the threshold this fraction of `for` → firing
    clear_margin: float = setting(0.9, "figure")  # slo: clear when over margin × threshold less than …
    clear_fraction: float = setting(0.5, "figure")  # … this fraction of the time
    peer_window: float = setting(300.0, "span")
    peer_min: int = setting(3, "count", ge=1)  # fewest peers for the peer rule
    peer_z: float = setting(5.0, "figure")  # peer: robust z to fire …
    peer_ratio: float = setting(2.0, "figure")  # … and at least this many times the peers' median …
    peer_floor: float = setting(0.005, "duration")  # … and at least this many seconds above it
    peer_z_clear: float = setting(3.0, "figure")
    peer_ratio_clear: float = setting(1.5, "figure")
    # the peers' spread counts as at least this fraction of their median
    peer_min_scale: float = setting(0.1, "figure")
    trend_window: float = setting(1800.0, "span")
    trend_buckets: int = setting(12, "count", ge=6)
    trend_confidence: float = setting(0.999, "figure")
    trend_confidence_clear: float = setting(0.9, "figure")
    # trend: fire on growth of at least +50 % over the window …
    trend_min_growth: float = setting(0.5, "figure")
    trend_decel: float = setting(0.4, "figure")  # … that is not levelling off (recent slope / window slope) …
    # … and reaches the SLO within this long (when there is an SLO)
    horizon: float = setting(3600.0, "duration")
    throttle_ratio: float = setting(0.1, "figure")  # cause: throttled in this fraction of CFS periods
    pressure_ratio: float = setting(0.05, "figure")  # cause: PSI memory `some` stall seconds per second
    near_limit: float = setting(0.9, "figure")  # cause: RSS over this fraction of the memory limit
    major_faults_rate: float = setting(50.0, "figure")  # cause: major page faults per second
    open_after: int = setting(2, "count", ge=1)  # lifecycle: consecutive firing judgements to open a finding
    resolve_after: int = setting(4, "count", ge=1)  # lifecycle: consecutive clear judgements to resolve it

    def __post_init__(self) -> None:
        if not (self.step > 0 and self.stale > 0 and self.peer_window > 0 and self.trend_window > 0):
            raise ValueError("invalid slow detection parameters: step, stale and windows must be positive")
        if self.peer_min < 1 or self.trend_buckets < 6 or self.open_after < 1 or self.resolve_after < 1:
            raise ValueError(
                "invalid slow detection parameters: peer_min, open_after, resolve_after >= 1, trend_buckets >= 6"
            )

    def scaled(self, scale: TimeScale | float) -> SlowParams:
        """The same detector on a shorter time axis (`agent.core.timescale`), each window held at the
        samples it judges: a value holds `STALE_SAMPLES` probe intervals, the peer window spans
        `WINDOW_SAMPLES`, each trend bucket one, and the judgements that open a finding
        (`open_after` x `step`) `EVIDENCE_SAMPLES`."""
        axis = TimeScale.of(scale)
        return replace(
            self,
            step=axis.span(self.step, axis.samples(max(1.0, EVIDENCE_SAMPLES / self.open_after))),
            stale=axis.span(self.stale, axis.samples(STALE_SAMPLES)),
            peer_window=axis.span(self.peer_window, axis.samples(WINDOW_SAMPLES)),
            trend_window=axis.span(self.trend_window, axis.samples(self.trend_buckets)),
            horizon=axis.span(self.horizon),
        )

    @property
    def relative_window(self) -> float:
        """The span over which an instance's latency is compared with its peers' as it changes
        (`judge_relative`): three trend windows, each of its points one judgement step apart
        multiplied by a whole number, so a replay reads the levels it judged at earlier ticks."""
        return self.relative_spacing * (RELATIVE_POINTS - 1)

    @property
    def relative_spacing(self) -> float:
        """Seconds between two of the relative rule's instants in its window: a whole number of
        judgement steps."""
        return (
            max(1, round(RELATIVE_SPAN * self.trend_window / (RELATIVE_POINTS - 1) / self.step)) * self.step
        )

    @property
    def relative_reach(self) -> float:
        """How far before the tick the relative rule reads levels: its window and, before it, the
        instants of the instance's usual ratio to its peers (`BASELINE_POINTS`, two spacings apart)."""
        return self.relative_window + 2 * BASELINE_POINTS * self.relative_spacing

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(slots=True)
class Rule:
    state: State
    summary: str
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class LatencyView:
    """One instance's latency points within its current process lifetime, up to the tick."""

    series: InstanceSeries
    slo: Slo | None
    metric: str | None  # the series judged: the SLO's quantile, else the canary's latency
    points: Points
    lifetime_start: float

    @classmethod
    def at(
        cls, series: InstanceSeries, tick: float, slo: Slo | None, since: float = -math.inf
    ) -> LatencyView:
        """The view at `tick`; with `since`, only its points from then on (a level over a window
        that starts `stale` after `since` reads the same)."""
        start = lifetime_start(series, tick)
        metric = next((m for m in judged_metrics(slo) if series.series.get(m)), None)
        raw = (series.series.get(metric) or []) if metric else []
        first = bisect_left(raw, max(start, since), key=itemgetter(0))  # sorted by time
        end = bisect_right(raw, tick, key=itemgetter(0))
        points = [(ts, v) for ts, v in raw[first:end] if math.isfinite(v)]
        return cls(series, slo, metric, points, start)

    @property
    def instance(self) -> str:
        return self.series.instance

    @property
    def name(self) -> str:
        """How people call the figure: `p99`, `p99.9`, `mean latency`, `canary latency`."""
        if self.metric == CANARY:
            return "canary latency"
        if self.metric == MEAN:
            return "mean latency"
        return f"p{(self.slo.quantile if self.slo else 0.99) * 100:g}"

    def value_at(self, when: float, stale: float) -> float | None:
        """The value in effect at `when`: the last sample at or before it, if at most `stale` old."""
        index = bisect_right(self.points, (when, math.inf)) - 1
        if index < 0 or when - self.points[index][0] > stale:
            return None
        return self.points[index][1]

    def sampled(self, since: float, tick: float, stale: float, n: int = 24) -> list[float]:
        """The values in effect at `n` evenly spaced instants of (since, tick]: a time-weighted view
        that sparse storage of unchanged values does not bias."""
        step = (tick - since) / n
        found = (self.value_at(since + step * (i + 1), stale) for i in range(n))
        return [value for value in found if value is not None]

    def level(self, window: float, tick: float, params: SlowParams) -> float | None:
        """Median latency over the last `window`, the figure peers compare (None: too little data)."""
        n = 24
        values = self.sampled(tick - window, tick, params.stale, n)
        return median(values) if len(values) >= params.min_coverage * n else None


def lifetime_start(series: InstanceSeries, tick: float) -> float:
    """When the process judged at `tick` started: its last restart, else its recorded start time, else the first sample."""
    before = [r for r in series.restarts or [] if r <= tick]
    if before:
        return max(before)
    starts = series.series.get(START_TIME) or []
    for i in range(bisect_right(starts, tick, key=itemgetter(0)) - 1, -1, -1):
        if math.isfinite(starts[i][1]):  # the process's own start: steady as the window slides
            return starts[i][1]
    first = series.first_ts()
    return first if first is not None else tick


def time_over(points: Points, since: float, tick: float, level: float, stale: float) -> tuple[float, float]:
    """(seconds covered by data, seconds over `level`) in [since, tick]; each value holds until the
    next sample, `stale` seconds at most."""
    covered = over = 0.0
    for i, (ts, value) in enumerate(points):
        end = min(points[i + 1][0] if i + 1 < len(points) else tick, ts + stale, tick)
        begin = max(ts, since)
        if end > begin:
            covered += end - begin
            if value > level:
                over += end - begin
    return covered, over


def judge_slo(view: LatencyView, tick: float, params: SlowParams) -> Rule:
    """Over the SLO threshold for `fire_fraction` of its `for` window."""
    slo = view.slo
    if slo is None:
        return Rule("unknown", "no SLO configured (latency.slo)")
    if view.metric is None:
        return Rule("unknown", "no latency data")
    if view.metric == MEAN:
        return Rule(
            "unknown",
            f"the SLO is on p{slo.quantile * 100:g}, and the latency source gives only a mean: a mean "
            "cannot tell whether a quantile is over its threshold",
        )
    window, since = slo.window, tick - slo.window
    covered, over = time_over(view.points, since, tick, slo.threshold, params.stale)
    _, near = time_over(view.points, since, tick, slo.threshold * params.clear_margin, params.stale)
    middle = median(view.sampled(since, tick, params.stale) or [math.nan])
    figures = {
        "metric": view.metric,
        "quantile": slo.quantile,
        "threshold_seconds": slo.threshold,
        "window_seconds": window,
        "covered_seconds": round(covered, 3),
        "over_fraction": round(over / window, 4),
        "median_seconds": middle,
    }
    if covered < params.min_coverage * window:
        return Rule(
            "unknown",
            f"{view.name} covers {covered:.0f}s of the {format_duration(window)} SLO window",
            figures,
        )
    text = (
        f"{view.name} over the {ms(slo.threshold)} SLO for {over / window:.0%} of the last "
        f"{format_duration(window)} (median {ms(middle)})"
    )
    if over >= params.fire_fraction * window:
        return Rule("firing", text, figures)
    if near < params.clear_fraction * covered:
        return Rule("clear", text, figures)
    return Rule("holding", text, figures)


def judge_peer(
    view: LatencyView,
    level: float | None,
    peers: Mapping[str, float],
    params: SlowParams,
    usual: float | None = None,
    lately: float | None = None,
) -> Rule:
    """A robust outlier against the median and MAD of the peers' levels (the instance left out).
    An instance that usually runs slower than its peers (`usual`, its usual ratio to them, above 1:
    a busier node, older hardware) fires at once only at `peer_ratio` times that ratio, else once
    its ratio has held `peer_ratio` for a quarter of an hour (`lately`, from `ratio_lately`): one
    usually at 1.6x whose level touches 2x for a few minutes under noise has not changed, and one
    creeping for hours is still found at 2x although its usual ratio creeps behind it."""
    if level is None:
        return Rule("unknown", "too few latency samples in the peer window")
    if len(peers) < params.peer_min:
        return Rule(
            "unknown", f"{len(peers)} peer(s) with {view.name} data; the peer rule needs {params.peer_min}"
        )
    values = list(peers.values())
    centre = median(values)
    mad = median([abs(v - centre) for v in values])
    scale = max(1.4826 * mad, params.peer_min_scale * centre, 1e-6)
    z = (level - centre) / scale
    ratio = level / centre if centre > 0 else math.inf
    above = max(1.0, usual or 1.0)  # a bar scaled by where the instance usually sits, never lowered
    figures = {
        "metric": view.metric,
        "level_seconds": level,
        "peer_median_seconds": centre,
        "peer_mad_seconds": mad,
        "robust_z": round(z, 2),
        "ratio": round(ratio, 3) if math.isfinite(ratio) else None,
        "peers": len(values),
        "peer_levels": dict(sorted(peers.items())),
        "usual_ratio": None if usual is None else round(usual, 4),
        "ratio_lately": None if lately is None else round(lately, 4),
    }
    text = (
        f"{view.name} {ms(level)} is {ratio:.1f}× the median of {len(values)} peers ({ms(centre)}; robust z {z:.1f}"
        + (f"; usually {usual:.2f}×" if above > 1 else "")
        + ")"
    )
    held = ratio >= params.peer_ratio * above or (lately is not None and lately >= params.peer_ratio)
    if z >= params.peer_z and ratio >= params.peer_ratio and held and level - centre >= params.peer_floor:
        return Rule("firing", text, figures)
    if z < params.peer_z_clear or ratio < params.peer_ratio_clear or level - centre < params.peer_floor / 2:
        return Rule("clear", text, figures)
    return Rule("holding", text, figures)


def judge_trend(view: LatencyView, tick: float, params: SlowParams) -> Rule:
    """Steady growth of the bucket medians over `trend_window`, by the memory detectors' trend test."""
    window = params.trend_window
    since = max(tick - window, view.lifetime_start)
    width = window / params.trend_buckets
    buckets: dict[int, list[float]] = {}
    for ts, value in view.points:
        if ts > since:
            buckets.setdefault(min(int((ts - since) / width), params.trend_buckets - 1), []).append(value)
    for k in range(params.trend_buckets):  # a bucket without samples takes the value still in effect
        held = None if k in buckets else view.value_at(since + (k + 0.5) * width, params.stale)
        if held is not None:
            buckets[k] = [held]
    need = params.trend_buckets // 2
    if len(buckets) < need or tick - since < params.min_coverage * window:
        return Rule(
            "unknown",
            f"the trend needs {format_duration(window)} of this process with {need} buckets of data",
        )
    keys = sorted(buckets)
    xs = [since + (k + 0.5) * width for k in keys]
    ys = [median(buckets[k]) for k in keys]
    fit = fit_trend(xs, ys, floor=0.1 * median(ys))
    start_level = max(median(ys[: max(2, len(ys) // 3)]), 1e-4)  # the first third's median, at least 0.1 ms
    growth = fit.slope * window / start_level
    slo = view.slo
    to_slo = max(0.0, (slo.threshold - fit.level) / fit.slope) if slo is not None and fit.slope > 0 else None
    figures = {
        "metric": view.metric,
        "slope_seconds_per_hour": fit.slope * 3600,
        "growth_over_window": round(growth, 4),
        "confidence": round(fit.confidence, 5),
        "decel": round(fit.decel, 3),
        "level_seconds": fit.level,
        "window_seconds": window,
        "time_to_slo_seconds": to_slo,
    }
    text = (
        f"{view.name} grows {ms(fit.slope * 3600)}/h ({growth:+.0%} over {format_duration(window)}, "
        f"confidence {fit.confidence:.4f})"
    )
    if slo is not None and to_slo is not None:
        text += (
            f"; reaches the {ms(slo.threshold)} SLO in {format_duration(to_slo)}"
            if to_slo
            else "; over its SLO"
        )
    urgent = slo is None or (to_slo is not None and to_slo <= params.horizon)
    steady = fit.decel >= params.trend_decel
    if fit.confidence >= params.trend_confidence and growth >= params.trend_min_growth and steady and urgent:
        return Rule("firing", text, figures)
    if (
        fit.confidence < params.trend_confidence_clear
        or fit.slope <= 0
        or growth < params.trend_min_growth / 2
    ):
        return Rule("clear", text, figures)
    return Rule("holding", text, figures)


def fit_trend(xs: list[float], ys: list[float], floor: float) -> Trend:
    """The memory detectors' robust trend test (`agent.detect.trend`) on latency bucket medians:
    steps larger than `floor` removed, Theil-Sen slope, Mann-Kendall confidence."""
    steps = remove_steps(ys, floor)
    return trend(xs, ys, steps, mann_kendall(steps.clean)[1])


def ms(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-"
    return f"{seconds * 1000:.0f}ms" if abs(seconds) < 1 else f"{seconds:.2f}s"
