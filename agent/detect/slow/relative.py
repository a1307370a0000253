"""The relative rule of the slow detector: one instance's latency over its peers' median, judged
against where it usually sits among them, so a swing the whole fleet shares cancels out.

`agent.detect.slow.detector` judges it live and `agent.detect.slow.replay` over a recorded fleet;
its tunables (`RELATIVE_*`, `BASELINE_POINTS`) live with the other rules' in `rules`.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from agent.core.units import format_duration
from agent.detect.slow.rules import (
    BASELINE_POINTS,
    RELATIVE_GROWTH,
    RELATIVE_POINTS,
    LatencyView,
    Rule,
    SlowParams,
    fit_trend,
)
from agent.detect.trend import _kernels, median

# an instance's ratio is steadied for the fleet's level only where its slope on that level stands
# this many standard errors from 0 over the instants before the window
ELASTICITY_T = 3.0
STEADY_FROM = 1 + RELATIVE_GROWTH / 2  # and only where its ratio rose this much within the window


class RatioAt(NamedTuple):
    """An instance's level over its peers' median level at one instant, and that median."""

    at: float
    ratio: float
    peers: float


def relative_instants(tick: float, params: SlowParams) -> list[float]:
    """The instants whose levels `judge_relative` compares, oldest first (multiples of the step):
    `BASELINE_POINTS` before its window, two spacings apart, then `RELATIVE_POINTS` over it."""
    spacing = params.relative_spacing
    start = tick - params.relative_window
    return [start - 2 * spacing * (BASELINE_POINTS - k) for k in range(BASELINE_POINTS)] + [
        tick - spacing * (RELATIVE_POINTS - 1 - k) for k in range(RELATIVE_POINTS)
    ]


def relative_ratios(
    instance: str,
    levels: Sequence[Mapping[str, tuple[float, str | None]]],
    since: float,
    instants: Sequence[float],
    peer_min: int,
) -> list[RatioAt]:
    """The instance's level over its peers' median level (`RatioAt`) at each of `instants` from its
    lifetime start `since` on, where it and at least `peer_min` peers have a level; each level is
    (seconds, the series it was read from), and only peers read from the instance's own series
    count (a mean is never set against a p99)."""
    out = []
    for at, known in zip(instants, levels, strict=True):
        own = known.get(instance)
        if at < since or own is None:
            continue
        peers = [value for name, (value, metric) in known.items() if name != instance and metric == own[1]]
        if len(peers) < peer_min:
            continue
        centre = median(peers)
        ratio = own[0] / centre if centre > 0 else math.nan
        if 0 < ratio < math.inf:
            out.append(RatioAt(at, ratio, centre))
    return out


def steadied(ratios: Sequence[RatioAt], tick: float, params: SlowParams) -> tuple[list[RatioAt], float]:
    """The ratios with how they move with the fleet's level taken out, and that elasticity (the
    slope of log ratio on log peers' median over the instants before the window).

    Where the peers share a delay that follows the traffic (queueing), a fast instance's ratio
    rises with the fleet's level and falls as it ebbs, so a creep while the fleet ebbs barely
    moves its ratio. Each ratio is set to the fleet's usual level by that slope, where it stands
    `ELASTICITY_T` standard errors from 0, bounded by what a delay shared in full gives (between 0
    and 1/ratio - 1 at the usual ratio); a fleet whose instances scale alike keeps its ratios. Only
    a ratio that rose by half the rule's growth within the window (`STEADY_FROM`) is steadied: one
    that did not is nothing the rule would look at twice, and the replay's screen can tell."""
    start = tick - params.relative_window - 1e-6
    before = [(math.log(p.peers), math.log(p.ratio)) for p in ratios if p.at < start]
    recent = [p for p in ratios if p.at >= start]
    if len(before) * 2 < BASELINE_POINTS or not recent or relative_rise(recent)[2] < STEADY_FROM - 1:
        return list(ratios), 0.0
    slope, mean_x = elasticity(before)
    if not slope:
        return list(ratios), 0.0
    return [p._replace(ratio=p.ratio * math.exp(slope * (mean_x - math.log(p.peers)))) for p in ratios], slope


def elasticity(before: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(the slope of log ratio on log peers' median over `before`, pairs of those logs, where it
    stands `ELASTICITY_T` standard errors from 0 and bounded by what a delay shared in full gives,
    else 0; the mean log peers' median it is taken from)."""
    slope, bar, mean_x, mean_y = _slope_and_bar(before)
    if slope is None or slope * slope < bar:
        return 0.0, mean_x
    shared = 1 / math.exp(mean_y) - 1
    return min(max(0.0, shared), max(min(0.0, shared), slope)), mean_x


def _slope_and_bar(pairs: Sequence[tuple[float, float]]) -> tuple[float | None, float, float, float]:
    """(the least-squares slope of y on x over `pairs`, None where x barely varies; the square it
    must reach to stand `ELASTICITY_T` standard errors from 0; the mean of x; the mean of y)."""
    n = sx = sy = sxx = sxy = syy = 0.0
    for x, y in pairs:  # one pass of plain sums: the replay's screen asks this of many ticks
        n, sx, sy, sxx, sxy, syy = n + 1, sx + x, sy + y, sxx + x * x, sxy + x * y, syy + y * y
    mean_x, mean_y = sx / n, sy / n
    spread_x, spread_y, joint = sxx - sx * mean_x, syy - sy * mean_y, sxy - sx * mean_y
    if spread_x <= 1e-12 * max(1.0, sxx):
        return None, 0.0, mean_x, mean_y
    slope = joint / spread_x
    residual = max(0.0, spread_y - slope * joint) / max(1.0, n - 2)
    return slope, ELASTICITY_T * ELASTICITY_T * residual / spread_x, mean_x, mean_y


def relative_rise(ratios: Sequence[RatioAt]) -> tuple[float, float, float]:
    """(the ratio at first: median of the first three; now: of the last three; the rise between)."""
    first = median([p.ratio for p in ratios[:3]])
    now = median([p.ratio for p in ratios[-3:]])
    return first, now, (now / first - 1 if first > 0 else 0.0)


def usual_ratio(ratios: Sequence[RatioAt], tick: float, params: SlowParams) -> float | None:
    """The instance's usual level over its peers' median: the median of its ratios before the
    relative window, when at least half of those instants had one (else None: not known yet)."""
    start = tick - params.relative_window - 1e-6
    before = [p.ratio for p in ratios if p.at < start]
    return median(before) if len(before) * 2 >= BASELINE_POINTS else None


def ratio_lately(ratios: Sequence[RatioAt], tick: float, params: SlowParams) -> float | None:
    """The instance's ratio to its peers of late: the median of its newest three instants (two
    spacings, a quarter of an hour by default) when all three are known, else None."""
    newest = [p.ratio for p in ratios if p.at >= tick - 2 * params.relative_spacing - 1e-6]
    return median(newest) if len(newest) == 3 else None


def relative_bar(usual: float | None) -> float:
    """The ratio to its peers an instance must reach for the relative rule: 30 % above its own usual
    ratio once that is known (a pod that usually runs at 0.6x its peers and creeps to 0.9x has
    slowed by half while still faster than most; one usually at 1.3x that swings to 1.55x as the
    fleet's queueing delay ebbs at night has not slowed at all), else 30 % above their median."""
    return (1 + RELATIVE_GROWTH) * (1.0 if usual is None else usual)


def judge_relative(
    view: LatencyView,
    ratios: Sequence[RatioAt],
    tick: float,
    params: SlowParams,
    usual: float | None,
    elasticity: float = 0.0,
) -> Rule:
    """The instance's latency over its peers' median grows steadily and is now well above where it
    usually sits among them (`usual`, from `usual_ratio`; their median until that is known): one
    instance creeping while the fleet's traffic swings all of them alike (a daily 2-3x cycle moves
    every instance; the ratio cancels it)."""
    window = params.relative_window
    start = tick - window - 1e-6
    recent = [p for p in ratios if p.at >= start]
    if len(recent) < params.min_coverage * RELATIVE_POINTS:
        return Rule(
            "unknown",
            f"comparing with peers over {format_duration(window)} needs {params.peer_min} peers with latency data",
        )
    first, now, rise = relative_rise(recent)
    # in logarithms: a ratio is multiplicative, and one of extreme levels stays a finite number
    fit = fit_trend([p.at for p in recent], [math.log(p.ratio) for p in recent], floor=math.log(1.1))
    bar = relative_bar(usual)
    figures = {
        "metric": view.metric,
        "ratio_to_peers": round(now, 4),
        "ratio_growth": round(rise, 4),
        "usual_ratio": None if usual is None else round(usual, 4),
        "elasticity": round(elasticity, 3),
        "confidence": round(fit.confidence, 5),
        "decel": round(fit.decel, 3),
        "window_seconds": window,
    }
    text = (
        f"{view.name} went from {first:.2f}x to {now:.2f}x its peers' median over "
        f"{format_duration(window)} (confidence {fit.confidence:.4f}"
        + ("" if usual is None else f"; usually {usual:.2f}x")
        + ("" if not elasticity else f"; set to the fleet's usual level, elasticity {elasticity:+.2f}")
        + ")"
    )
    if (
        rise >= RELATIVE_GROWTH
        and now >= bar
        and fit.confidence >= params.trend_confidence
        and fit.decel >= params.trend_decel
    ):
        return Rule("firing", text, figures)
    if (
        rise < RELATIVE_GROWTH / 2
        or now < bar * (1 + RELATIVE_GROWTH / 2) / (1 + RELATIVE_GROWTH)
        or fit.confidence < params.trend_confidence_clear
    ):
        return Rule("clear", text, figures)
    return Rule("holding", text, figures)


_GROW = 1 + RELATIVE_GROWTH - 1e-9  # the relative rule's rise, less a rounding's worth


def may_rise(window: Sequence[float], before: Sequence[float]) -> bool:
    """Whether `judge_relative` might fire on these ratios (`window` newest first, `before` the
    window), for the replay's screen: one of the newest five `1 + RELATIVE_GROWTH` times the lower
    of 1 and the lowest before (the usual ratio is a median of those, or 1 unknown) and that many
    times the lowest of the window (a median of three is at most their largest and at least the
    lowest of all)."""
    recent = max(window[:5])
    return recent >= _GROW * min([1.0, *before]) and recent >= _GROW * min(window)


def steadied_may_rise(ratios: Sequence[RatioAt], tick: float, params: SlowParams) -> bool:
    """Whether `may_rise` holds for the instance's ratios as `judge_relative` reads them at `tick`
    (`steadied`)."""
    steady = steadied(ratios, tick, params)[0]
    start = tick - params.relative_window - 1e-6
    newest_first = [p.ratio for p in steady if p.at >= start][::-1]
    return bool(newest_first) and may_rise(newest_first, [p.ratio for p in steady if p.at < start])


def rising_ticks(
    ratios: Sequence[Sequence[float]],
    peers: Sequence[Sequence[float]],
    judged: Sequence[float],
    index: Mapping[int, int],
    params: SlowParams,
    lifetime_start: Callable[[int, int], float],
) -> dict[int, list[int]]:
    """Per instance, the ticks of `judged` where `judge_relative` might fire, for the replay's
    screen, from each instance's ratio to its peers' median and that median at each tick (nan:
    none; `index`: a tick's position by its step number): where `may_rise` holds for its ratios
    at the rule's instants, or for its ratios within its lifetime (`lifetime_start(instance,
    tick)`) as `steadied` sets them where it might set them. The test over every tick of every
    instance is `_kernels.rising_screen` where it is built, else its twin `rising_flags`."""
    width = BASELINE_POINTS + RELATIVE_POINTS
    positions, firsts = array("d"), []  # each tick's instants by their position (-1: none); the first's time
    for when in judged:
        instants = relative_instants(when, params)
        firsts.append(instants[0])
        positions.extend([float(index.get(round(x / params.step), -1)) for x in instants])

    def ticks(t: int) -> list[int | None]:
        return [None if k < 0 else int(k) for k in positions[t * width : (t + 1) * width]]

    shared = positions.tobytes()
    places: list[list[int | None]] | None = None  # for the Python twin only
    out: dict[int, list[int]] = {}
    for i, of_instance in enumerate(ratios):  # one at a time: all a fleet's weeks at once took 100 MB more
        row = None
        if _kernels is not None and of_instance and judged:
            row = _kernels.rising_screen(
                array("d", of_instance).tobytes(),
                array("d", peers[i]).tobytes(),
                len(of_instance),
                shared,
                BASELINE_POINTS,
                RELATIVE_POINTS,
                (_GROW, _STEADY, ELASTICITY_T),
            )
        if row is None:
            places = places if places is not None else [ticks(t) for t in range(len(judged))]
            row = rising_flags([of_instance], [peers[i]], places)
        for t in [t for t, flag in enumerate(row) if flag]:
            if row[t] == RISES:
                out.setdefault(i, []).append(t)
                continue
            since = lifetime_start(i, t)
            if row[t] == STEADIED and since <= firsts[t]:
                continue  # no elasticity, and every instant in its lifetime: as `may_rise` said
            if _steadied_rises(of_instance, peers[i], ticks(t), judged[t], params, since):
                out.setdefault(i, []).append(t)
    return out


_STEADY = STEADY_FROM * (1 - 1e-9)  # ...and the rise within the window from which `steadied` sets ratios
RISES, ELASTIC, STEADIED = 1, 2, 3  # `rising_flags`: may rise; may once steadied; may only with a later start


def rising_flags(
    ratios: Sequence[Sequence[float]],
    peers: Sequence[Sequence[float]],
    places: Sequence[Sequence[int | None]],
) -> bytes:
    """For each instance and judged tick (instance by instance), `RISES` where `may_rise` holds
    for its ratios at the rule's instants (`places`: their tick positions, None: no tick); where it
    does not but the newest five reach `STEADY_FROM` times the lowest of the window and at least
    half of the instants before it have a ratio (`steadied` may set them), `STEADIED` when those
    certainly show no elasticity (`_inelastic`: only a lifetime that began within them can change
    what `may_rise` said) and `ELASTIC` otherwise; else 0 (`_kernels.rising_screen` in C)."""
    out = bytearray(len(ratios) * len(places))
    for i, of_instance in enumerate(ratios):
        for t, ticks in enumerate(places):
            window = [
                of_instance[k]
                for k in ticks[BASELINE_POINTS:][::-1]
                if k is not None and not math.isnan(of_instance[k])
            ]
            if not window:
                continue
            earlier = [k for k in ticks[:BASELINE_POINTS] if k is not None and not math.isnan(of_instance[k])]
            if may_rise(window, [of_instance[k] for k in earlier]):
                out[i * len(places) + t] = RISES
            elif len(earlier) * 2 >= BASELINE_POINTS and max(window[:5]) >= _STEADY * min(window):
                pairs = [(math.log(peers[i][k]), math.log(of_instance[k])) for k in earlier]
                out[i * len(places) + t] = STEADIED if _inelastic(pairs) else ELASTIC
    return bytes(out)


def _inelastic(pairs: Sequence[tuple[float, float]]) -> bool:
    """Whether `elasticity` certainly finds none in `pairs`: `1 - 1e-9` of its bar (the
    borderline is left to it), as `_kernels.rising_screen` reads it."""
    slope, bar, _, _ = _slope_and_bar(pairs)
    return slope is None or slope * slope < (1 - 1e-9) * bar


def _steadied_rises(
    of_instance: Sequence[float],
    peers: Sequence[float],
    ticks: Sequence[int | None],
    when: float,
    params: SlowParams,
    since: float,
) -> bool:
    """Whether `may_rise` holds for an instance's ratios as `steadied` sets them at `when`, its
    process having started at `since` (`ticks`: the positions of `relative_instants` at `when`,
    None: no tick): a ratio that rose `STEADY_FROM` within the window but not the rule's growth
    may reach it once set to the fleet's usual level, as the judgement sets it."""
    instants = relative_instants(when, params)
    if since <= instants[0]:
        earlier = [k for k in ticks[:BASELINE_POINTS] if k is not None and not math.isnan(of_instance[k])]
        if not elasticity([(math.log(peers[k]), math.log(of_instance[k])) for k in earlier])[0]:
            return False  # every instant in its lifetime, and no elasticity: as `may_rise` said
    points = [
        RatioAt(x, of_instance[k], peers[k])
        for x, k in zip(instants, ticks, strict=True)
        if x >= since and k is not None and not math.isnan(of_instance[k])
    ]
    return steadied_may_rise(points, when, params)
