"""The slow detector replayed over recorded series, as the agent would have judged them.

`medic analyze` gives the latency series of its input (`latency_p99_seconds` and the other
quantiles, or the canary's) to `analyze_slow`: on the slow detector's epoch-aligned grid, each
fleet of peers is judged by `evaluate_slow` with the samples the agent's detection job would have
loaded at that instant (the last `agent.detect.slow.detector.history` seconds), and the observations go
through the same lifecycle (`open_after`, `resolve_after`). The findings are added to each
instance's `InstanceAnalysis`, so the table and `--json` list them beside the memory findings.

Weeks of one-minute samples are tens of thousands of judgements per instance, and nearly all of
them clear. A finding can only begin at a judgement that fires, so the replay judges in full only
the ticks where a rule might fire, and every tick from there until the finding is gone: the C
screen (`agent.detect._kernels.slow_screen`) computes each instance's peer level at every tick and
marks the ticks where its SLO or trend rule could fire (the same arithmetic; a near tie is
marked too), and a tick's peer rule can only fire for an instance whose level reaches twice the
lowest median its peers could have. The findings are those of judging every tick (a property
test holds the two equal); without the C extension every tick is judged.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from itertools import compress

from agent.detect.coverage import Interval, seen_from, steps_seen
from agent.detect.lifecycle import update
from agent.detect.model import START_TIME, Finding, InstanceAnalysis, InstanceSeries, Observation, Points
from agent.detect.slow.detector import (
    DEFAULT_SLOW,
    INPUT_METRICS,
    LATENCY_METRICS,
    Level,
    history,
    judge_view,
    judged_reach,
    tick_for,
)
from agent.detect.slow.relative import relative_instants, relative_ratios, rising_ticks
from agent.detect.slow.rules import (
    CANARY,
    MEAN,
    LatencyView,
    Slo,
    SlowParams,
    judged_metrics,
    lifetime_start,
)
from agent.detect.trend import _kernels, normal_cdf


def has_latency(series: InstanceSeries) -> bool:
    return any(series.series.get(metric) for metric in LATENCY_METRICS)


class _Window:
    """One instance's slow-detector inputs, cut to what the agent loads for a judgement at `tick`."""

    def __init__(self, series: InstanceSeries) -> None:
        self.series = series
        self.metrics = {m: p for m, p in series.series.items() if m in INPUT_METRICS and p}
        self.times = {m: [ts for ts, _ in points] for m, points in self.metrics.items()}
        self.first = min(points[0][0] for points in series.series.values() if points)
        # one process from its first sample on: no restarts, one recorded start at or before it
        starts = {value for _, value in self.metrics.get(START_TIME, [])}
        fixed = not series.restarts and all(math.isfinite(v) and v <= self.first for v in starts)
        self.one_start = self.first if fixed and len(starts) <= 1 else None

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
    screen: bool = True,
) -> int:
    """Replay the slow detector over each fleet (peers of one another) and add its findings to the
    instances' analyses; returns the number of judgement ticks (0: no latency in the input).
    `screen=False` judges every tick in full (the reference the screen is held to)."""
    slos = slos or {}
    judged = 0
    groups = [[s for s in fleet if has_latency(s)] for fleet in fleets]
    groups = [group for group in groups if group]
    for number, members in enumerate(groups, 1):
        replay = _FleetReplay(members, params, slos, screen)
        judged += len(replay.ticks)
        for finding, at_open in replay.findings():
            analysis = analyses.get(finding.instance)
            if analysis is None:
                continue
            analysis.findings.append(finding)
            if at_open is not None:
                analysis.at_open[finding.id] = at_open
        if progress is not None:
            progress(number, len(groups))
    for analysis in analyses.values():
        analysis.findings.sort(key=lambda f: (f.opened_at or math.inf, f.kind))
    return judged


def grid(
    first: float, last: float, params: SlowParams, seen: Sequence[Interval] | None = None
) -> list[float]:
    """The judgement ticks over samples from `first` to `last`, as the agent's job makes them (the
    multiples of the step); with `seen`, only those in its intervals (`agent.detect.coverage`)."""
    step = params.step
    k_first = math.floor(first / step + 1e-9) + 1
    k_last = math.floor(last / step + 1e-9) + 1
    while k_last * step > last + 1e-9:
        k_last -= 1
    steps = range(k_first, k_last + 1) if seen is None else steps_seen(seen, step, k_first, k_last)
    return [k * step for k in steps]


class _FleetReplay:
    """The slow detector's judgements of one fleet over the whole grid, and their findings."""

    def __init__(
        self,
        members: Sequence[InstanceSeries],
        params: SlowParams,
        slos: Mapping[str, Slo | None],
        screen: bool,
    ) -> None:
        self.params = params
        self.slos = slos
        self.span = history(params, slos)
        self.windows = [_Window(series) for series in members]
        self.names = [w.series.instance for w in self.windows]
        first = min(min(points[0][0] for points in w.metrics.values()) for w in self.windows)
        last = max(max(points[-1][0] for points in w.metrics.values()) for w in self.windows)
        # a tick where no member has a sample in the history it loads judges them all "unknown"
        seen = seen_from(
            (times for w in self.windows for times in w.times.values()),
            judged_reach(params, slos) + params.step,
            params.step,
            None,
        )
        self.ticks = grid(first, last, params, seen)  # when the samples are loaded …
        self.judged = [tick_for(tick, params) for tick in self.ticks]  # … and the instant judged
        self.first_sample = first
        self.tick_array, self.judged_array = array("d", self.ticks), array("d", self.judged)
        self.index = {round(when / params.step): t for t, when in enumerate(self.judged)}  # by step number
        self._screen_instants = (self.tick_array.tobytes(), self.judged_array.tobytes())
        self.python_levels: dict[tuple[int, int], Level | None] = {}
        self.python_metrics: dict[tuple[int, int], str | None] = {}
        screens = [self._screen(w) if screen else None for w in self.windows]
        self.levels: list[array[float] | None] = [found[0] if found else None for found in screens]
        self.odd = [found[2] if found else set() for found in screens]
        self.candidates: list[list[int]] = [
            found[1] if found else list(range(len(self.ticks))) for found in screens
        ]
        # the series each screened instance is judged on, but at the ticks of `switched` (its
        # quantile missing from the history loaded, its mean there): Python says which there
        self.metric: list[str | None] = [found[3] if found else None for found in screens]
        self.switched: list[set[int]] = [found[4] if found else set() for found in screens]
        if any(found is None for found in screens):  # peers' levels unknown to the screen: judge all
            self.candidates = [list(range(len(self.ticks))) for _ in self.windows]
        else:
            for index, extra in self._peer_candidates().items():
                self.candidates[index] = sorted({*self.candidates[index], *extra})
            for index, extra in self._relative_candidates().items():
                self.candidates[index] = sorted({*self.candidates[index], *extra})

    def _screen(self, window: _Window) -> tuple[array[float], list[int], set[int], str, set[int]] | None:
        """(level per tick, -inf for none; the ticks where the SLO or trend rule might fire or the
        level needs Python; those of them that need Python; the series judged; the ticks where
        another series may be judged instead) from the C screen, or None when this instance must
        be judged at every tick (no extension, or an input it does not model)."""
        if _kernels is None or not hasattr(_kernels, "slow_screen"):
            return None
        params, slo = self.params, self.slos.get(window.series.instance)
        present = [m for m in judged_metrics(slo) if m in window.metrics] or [CANARY]
        metric = present[0]
        if CANARY in present[1:]:
            return None  # which one is judged depends on the window: leave it to the rules
        switched = self._switched(window, metric) if MEAN in present[1:] else set()
        restarts = window.series.restarts or []
        if not all(math.isfinite(r) for r in restarts):
            return None
        starts = window.metrics.get(START_TIME, [])
        numbers = (
            window.first, self.span, params.stale, params.peer_window, params.min_coverage,
            slo.threshold if slo else math.nan, slo.window if slo else 0.0, params.fire_fraction,
            params.trend_window, float(params.trend_buckets), params.trend_min_growth,
            _z_for(params.trend_confidence), 0.0, 0.0, 0.0, 0.0,
        )  # fmt: skip
        found = _kernels.slow_screen(
            *self._screen_instants,
            window.metrics.get(metric, []),
            starts,
            array("d", sorted(restarts)).tobytes(),
            numbers,
        )
        if found is None:  # points that are not pairs of floats
            return None
        levels_raw, flags_raw = found
        levels, flags = array("d"), array("d")
        levels.frombytes(levels_raw)
        flags.frombytes(flags_raw)
        marked = sorted({*compress(range(len(flags)), flags), *switched})
        odd = {t for t in marked if int(flags[t]) & 4} | switched
        return levels, marked, odd, metric, switched

    def _switched(self, window: _Window, quantile: str) -> set[int]:
        """The ticks whose loaded history holds the instance's mean but not its quantile: there the
        rules judge the mean (a histogram's both come together, so these are its edges)."""
        found = set()
        for t, load in enumerate(self.ticks):
            since = load - self.span
            if not _any_within(window.times[quantile], since, load) and _any_within(
                window.times[MEAN], since, load
            ):
                found.add(t)
        return found

    def _peer_candidates(self) -> dict[int, list[int]]:
        """Per instance, the ticks where its peer rule might fire: its level at least
        `peer_ratio` times and `peer_floor` above the lowest median its peers can have (the
        median of the fleet's levels without the highest)."""
        params = self.params
        levels = [
            array("d", (_or_unknown(self.level(i, t)) for t in range(len(self.ticks))))
            if self.odd[i]
            else level
            for i, level in enumerate(self.levels)
        ]
        out: dict[int, list[int]] = {}
        everyone = list(range(len(levels)))
        if len(set(self.metric)) > 1:  # peers of different series are not compared: judge them all
            return {i: list(range(len(self.ticks))) for i in everyone}
        switched = set().union(*self.switched)
        unknown = -math.inf
        for t, row in enumerate(zip(*levels)):
            if t in switched:
                for i in everyone:
                    out.setdefault(i, []).append(t)
                continue
            ordered = sorted(row)
            known = ordered[bisect_right(ordered, unknown) :]
            if len(known) - 1 < params.peer_min:
                continue
            rest = known[:-1]
            mid = len(rest) // 2
            low = rest[mid] if len(rest) % 2 else 0.5 * (rest[mid - 1] + rest[mid])
            bar = low + params.peer_floor
            if low > 0 and params.peer_ratio > 0:
                bar = max(bar, params.peer_ratio * low)
            bar -= 1e-9 * abs(bar) + 1e-12
            if known[-1] < bar:
                continue
            for i, value in enumerate(row):
                if value >= bar:
                    out.setdefault(i, []).append(t)
        return out

    def _relative_candidates(self) -> dict[int, list[int]]:
        """Per instance, the ticks where its relative rule might fire: its level over its peers'
        median (`relative_ratios`, with that median) at each tick, screened by `rising_ticks`."""
        params = self.params
        count = len(self.ticks)
        ratios: list[list[float]] = [[math.nan] * count for _ in self.names]
        centres: list[list[float]] = [[math.nan] * count for _ in self.names]
        for t in range(count):
            row = [self.peer_level(i, t) for i in range(len(self.names))]
            by_metric: dict[str | None, list[float]] = {}
            for found in row:
                if found is not None:
                    by_metric.setdefault(found.metric, []).append(found.seconds)
            for known in by_metric.values():
                known.sort()
            for i, found in enumerate(row):
                if found is None or len(known := by_metric[found.metric]) - 1 < params.peer_min:
                    continue
                centre = _median_without(known, bisect_left(known, found.seconds))
                ratio = found.seconds / centre if centre > 0 else math.nan
                if 0 < ratio < math.inf:
                    ratios[i][t], centres[i][t] = ratio, centre
        out = rising_ticks(ratios, centres, self.judged, self.index, params, self._lifetime_start)
        # where an instance's series changed within the window, the levels above are not the ones
        # a judgement reads (`levels_at`): Python judges those ticks
        switched = sorted(self.judged[s] for s in set().union(*self.switched))
        for t, when in enumerate(self.judged):
            if bisect_right(switched, when) > bisect_left(switched, when - params.relative_reach - 1e-9):
                for i in range(len(self.names)):
                    out.setdefault(i, []).append(t)
        return out

    def _lifetime_start(self, i: int, t: int) -> float:
        """When instance `i`'s process judged at tick `t` started, as its judgement reads it; for
        one process from its first sample on, that first sample (the judgement may read an earlier
        start, or the first sample it loads, but no instant with a level falls before either)."""
        window = self.windows[i]
        if window.one_start is not None:
            return window.one_start
        load = self.ticks[t]
        return lifetime_start(window.at(load - self.span, load), self.judged[t])

    def level(self, i: int, t: int) -> float | None:
        """Instance `i`'s peer level at tick `t`, as `evaluate_slow` computes it."""
        found = self.peer_level(i, t)
        return None if found is None else found.seconds

    def peer_level(self, i: int, t: int) -> Level | None:
        """Instance `i`'s peer level at tick `t` and the series it was read from."""
        screened, metric = self.levels[i], self.metric[i]
        if screened is not None and t not in self.odd[i]:
            value = screened[t]
            return None if value == -math.inf else Level(value, metric)
        key = (i, t)
        if key not in self.python_levels:
            view = self._view(i, t)
            seconds = view.level(self.params.peer_window, self.judged[t], self.params)
            self.python_levels[key] = None if seconds is None else Level(seconds, view.metric)
        return self.python_levels[key]

    def levels_at(self, t: int, at: float) -> dict[str, Level]:
        """Each instance's level at the earlier instant `at` as the judgement at tick `t` reads it
        (`evaluate_slow`): from the series loaded at `t`, so an instance whose judged series changed
        since (its quantile back after a gap) is read from the new one, not as that tick read it."""
        if at < self.first_sample:
            return {}
        k = self.index.get(round(at / self.params.step))
        out = {}
        for j, name in enumerate(self.names):
            if k is not None and self.metric_at(j, k) == self.metric_at(j, t):
                found = self.peer_level(j, k)
            else:
                load = self.ticks[t]
                series = self.windows[j].at(load - self.span, load)
                since = at - self.params.peer_window - self.params.stale
                view = LatencyView.at(series, at, self.slos.get(series.instance), since)
                seconds = view.level(self.params.peer_window, at, self.params)
                found = None if seconds is None else Level(seconds, view.metric)
            if found is not None:
                out[name] = found
        return out

    def metric_at(self, i: int, t: int) -> str | None:
        """The series instance `i` is judged on at tick `t`."""
        if self.levels[i] is not None:
            return MEAN if t in self.switched[i] else self.metric[i]
        key = (i, t)
        if key not in self.python_metrics:
            self.python_metrics[key] = self._view(i, t).metric
        return self.python_metrics[key]

    def _view(self, i: int, t: int) -> LatencyView:
        load = self.ticks[t]
        series = self.windows[i].at(load - self.span, load)
        return LatencyView.at(series, self.judged[t], self.slos.get(series.instance))

    def judge(self, i: int, t: int) -> Observation:
        """What `evaluate_slow` says of instance `i` at tick `t`."""
        view = self._view(i, t)
        known = {}
        for j, name in enumerate(self.names):
            found = self.peer_level(j, t)
            if found is not None:
                known[name] = found
        instants = relative_instants(self.judged[t], self.params)
        past = [self.levels_at(t, at) for at in instants]
        ratios = relative_ratios(view.instance, past, view.lifetime_start, instants, self.params.peer_min)
        return judge_view(view, self.level(i, t), known, self.judged[t], self.params, ratios)

    def findings(self) -> list[tuple[Finding, Finding | None]]:
        """Each finding that opened (as it ended or stands at the last tick), with the finding as
        it was when it opened."""
        out: list[tuple[Finding, Finding | None]] = []
        count = len(self.ticks)
        for i, candidates in enumerate(self.candidates):
            active: list[Finding] = []
            opened: dict[str, Finding] = {}
            at_open: dict[str, Finding] = {}
            position = 0
            t = candidates[0] if candidates else count
            while t < count:
                active, transitions = update(active, [self.judge(i, t)], self.params)  # type: ignore[arg-type]
                for change in transitions:
                    opened[change.finding.id] = change.finding
                    if change.change == "opened":
                        at_open[change.finding.id] = change.finding
                if active:  # a pending or open finding: every judgement counts until it is gone
                    t += 1
                    continue
                position = bisect_right(candidates, t, position)
                t = candidates[position] if position < len(candidates) else count
            for finding in active:
                if finding.state == "open":
                    opened[finding.id] = finding
            out.extend((finding, at_open.get(finding.id)) for finding in opened.values())
        return out


def _median_without(ordered: list[float], skip: int) -> float:
    """The median of the sorted `ordered` without its element at `skip`."""
    n = len(ordered) - 1

    def at(k: int) -> float:
        return ordered[k] if k < skip else ordered[k + 1]

    mid = n // 2
    return at(mid) if n % 2 else 0.5 * (at(mid - 1) + at(mid))


def _z_for(confidence: float) -> float:
    """A z a little under the one whose `normal_cdf` is `confidence`: a trend whose Mann-Kendall z
    is below it cannot reach that confidence."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if normal_cdf(mid) < confidence:
            lo = mid
        else:
            hi = mid
    return lo - 1e-6


def _any_within(times: Sequence[float], since: float, until: float) -> bool:
    return bisect_right(times, until) > bisect_left(times, since)


def _or_unknown(level: float | None) -> float:
    return -math.inf if level is None else level
