"""The relative rule of the slow detector: one instance's latency over its peers' median, judged
against where it usually sits among them, so a swing the whole fleet shares cancels out.

`agent.detect.slow.detector` judges it live and `agent.detect.slow.replay` over a recorded fleet;
its tunables (`RELATIVE_*`, `BASELINE_POINTS`) live with the other rules' in `rules`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

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
from agent.detect.trend import median


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
) -> list[tuple[float, float]]:
    """(instant, the instance's level over its peers' median level) at each of `instants` from its
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
            out.append((at, ratio))
    return out


def relative_rise(ratios: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """(the ratio at first: median of the first three; now: of the last three; the rise between)."""
    first = median([r for _, r in ratios[:3]])
    now = median([r for _, r in ratios[-3:]])
    return first, now, (now / first - 1 if first > 0 else 0.0)


def usual_ratio(ratios: Sequence[tuple[float, float]], tick: float, params: SlowParams) -> float | None:
    """The instance's usual level over its peers' median: the median of its ratios before the
    relative window, when at least half of those instants had one (else None: not known yet)."""
    start = tick - params.relative_window - 1e-6
    before = [r for at, r in ratios if at < start]
    return median(before) if len(before) * 2 >= BASELINE_POINTS else None


def ratio_lately(ratios: Sequence[tuple[float, float]], tick: float, params: SlowParams) -> float | None:
    """The instance's ratio to its peers of late: the median of its newest three instants (two
    spacings, a quarter of an hour by default) when all three are known, else None."""
    newest = [r for at, r in ratios if at >= tick - 2 * params.relative_spacing - 1e-6]
    return median(newest) if len(newest) == 3 else None


def relative_bar(usual: float | None) -> float:
    """The ratio to its peers an instance must reach for the relative rule: 30 % above its own usual
    ratio once that is known (a pod that usually runs at 0.6x its peers and creeps to 0.9x has
    slowed by half while still faster than most; one usually at 1.3x that swings to 1.55x as the
    fleet's queueing delay ebbs at night has not slowed at all), else 30 % above their median."""
    return (1 + RELATIVE_GROWTH) * (1.0 if usual is None else usual)


def judge_relative(
    view: LatencyView,
    ratios: Sequence[tuple[float, float]],
    tick: float,
    params: SlowParams,
    usual: float | None,
) -> Rule:
    """The instance's latency over its peers' median grows steadily and is now well above where it
    usually sits among them (`usual`, from `usual_ratio`; their median until that is known): one
    instance creeping while the fleet's traffic swings all of them alike (a daily 2-3x cycle moves
    every instance; the ratio cancels it)."""
    window = params.relative_window
    start = tick - window - 1e-6
    recent = [(at, r) for at, r in ratios if at >= start]
    if len(recent) < params.min_coverage * RELATIVE_POINTS:
        return Rule(
            "unknown",
            f"comparing with peers over {format_duration(window)} needs {params.peer_min} peers with latency data",
        )
    first, now, rise = relative_rise(recent)
    # in logarithms: a ratio is multiplicative, and one of extreme levels stays a finite number
    fit = fit_trend([x for x, _ in recent], [math.log(r) for _, r in recent], floor=math.log(1.1))
    bar = relative_bar(usual)
    figures = {
        "metric": view.metric,
        "ratio_to_peers": round(now, 4),
        "ratio_growth": round(rise, 4),
        "usual_ratio": None if usual is None else round(usual, 4),
        "confidence": round(fit.confidence, 5),
        "decel": round(fit.decel, 3),
        "window_seconds": window,
    }
    text = (
        f"{view.name} went from {first:.2f}x to {now:.2f}x its peers' median over "
        f"{format_duration(window)} (confidence {fit.confidence:.4f}"
        + ("" if usual is None else f"; usually {usual:.2f}x")
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
