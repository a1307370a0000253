"""Evidence carried from one lifetime of an instance to the next.

An orchestrator that restarts a process every ~20 h cuts a slow leak short before it has run
through the whole day that growth which is not urgent needs (`leak.assess`), so each lifetime
alone never proves it. What the same workload did in its previous lifetime is evidence too: a
lifetime that was still growing steadily when it ended (not levelling off like a cache filling
up or a warm-up), followed by one that grows alike after its warm-up, is the same leak twice.
A healthy process restarted as often warms up and levels off in every lifetime, which the
previous lifetime's end shows.

A leak that starts near a restart hides under the new lifetime's own fill instead (a cache
refilling after a deploy, fragmentation growing like log(t)): the curve levels, so the trend
does not fire until the limit. What the earlier lifetimes did tells it apart again: a healthy
lifetime levels where they levelled, daily peaks and all, and one that stays above every level
they reached at its age and still grows is not its fill (`outgrown`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from agent.core.units import format_bytes, format_duration
from agent.detect.memory.context import OUTGROWN_FOR, OUTGROWN_MARGIN, Context, above_settled
from agent.detect.memory.fit import Fit
from agent.detect.memory.growth import fits, jumped_lately, time_to_limit, traffic_explains

ALIKE = (0.67, 1.5)  # the current growth within these factors of the previous lifetime's


def _steady_growth(fit: Fit, ctx: Context, confidence: float) -> bool:
    """Growth that a leak shows and a working set does not: at `confidence`, at least `min_rate`,
    not decelerating, and no levelling curve fitting it better than the line."""
    p, t = ctx.params, fit.trend
    return (
        fit.scale not in ("daily", "cycle")  # a sine bends to fit a warm-up as well as a daily rise
        and fit.confidence >= p.confidence
        and t.confidence >= confidence
        and t.slope > 0
        and fit.pct_per_hour >= p.min_rate
        and t.decel >= p.decel_ratio
        and fit.levelling is None
    )


def ended_growing(ctx: Context, metric: str) -> tuple[Fit, float, float] | None:
    """(the fit, its lifetime's start, its end) of the previous lifetime's floor at its last
    judgement when it was still growing steadily then, over at least a window after its
    warm-up, with saturation ruled out (the tail of a warm-up bends); None otherwise (or with no
    previous lifetime). Cached per lifetime."""
    life = ctx.life - 1
    if life < 0:
        return None
    key = ("ended-growing", metric, life)
    prep = ctx.prep
    if key in prep.cache:
        return prep.cache[key]  # type: ignore[return-value]
    found = None
    start, end = prep.starts[life], prep.starts[life + 1]
    p = ctx.params
    tick = math.floor(end / p.step + 1e-9) * p.step
    if tick - start >= prep.warmup(life) + p.window:
        before = Context(prep, life, tick)
        grown = [
            f
            for f in fits(prep, metric, life, tick)
            if f.coverage >= p.window and _steady_growth(f, before, p.confidence) and f.saturation_ruled_out
        ]
        if grown:
            found = (max(grown, key=lambda f: f.coverage), start, end)
    prep.cache[key] = found
    return found


def carried(ctx: Context, metric: str) -> tuple[Fit, float | None, dict[str, Any]] | None:
    """(the fit, its time to OOM, the evidence) when this lifetime, past its warm-up and one
    window, grows steadily at the rate at which the previous lifetime was still growing when it
    ended: a leak cut short by restarts. None otherwise. The previous lifetime is the second fit
    of the same growth, so this one need only be seen growing at `confidence_clear` (the tail of
    its warm-up under the leak lowers the corrected test), as a fleet's alike instances are."""
    p = ctx.params
    if ctx.tick - ctx.lifetime_start < ctx.prep.warmup(ctx.life) + p.window:
        return None
    before = ended_growing(ctx, metric)
    if before is None:
        return None
    previous, start, end = before
    alike = [
        f
        for f in ctx.fits(metric)
        if _steady_growth(f, ctx, p.confidence_clear)
        and ALIKE[0] * previous.trend.slope <= f.trend.slope <= ALIKE[1] * previous.trend.slope
    ]
    for fit in sorted(alike, key=lambda f: -f.coverage):
        ttoom = time_to_limit(ctx.limit, ctx.peak, fit.trend.slope)
        if not fit.long_enough(p, ttoom) or traffic_explains(ctx.prep, fit, ctx.life, p.confidence):
            continue
        evidence = {
            "lifetimes": {
                "previous_start": start,
                "previous_end": end,
                "previous_pct_per_hour": round(previous.pct_per_hour, 4),
                "previous_scale": previous.scale,
            }
        }
        why = (
            f"the same growth ({previous.pct_per_hour:.2f} %/h) ran to the end of its previous "
            f"lifetime ({format_duration(end - start)})"
        )
        return fit, ttoom, evidence | {"why": why}
    return None


def outgrown(ctx: Context, metric: str) -> tuple[Fit, float | None, dict[str, Any]] | None:
    """(the fit, its time to OOM, the evidence) when this lifetime stays above the level its
    earlier lifetimes settled at (`above_settled`) and a fit still sees it growing (at
    `confidence_clear`, as `carried` allows), its growth not following the requests; None
    otherwise. The fit's slope is its recent one: the fill beneath the leak is most of its line."""
    level = above_settled(ctx, metric)
    if level is None:
        return None
    p = ctx.params
    # the fill beneath the leak bends the fit's line: its recent slope is what still grows
    growing = [
        replace(f, _trend=replace(f.trend, slope=f.trend.recent_slope))
        for f in ctx.fits(metric)
        if f.scale != "daily"
        and f.trend.confidence >= p.confidence_clear
        and f.trend.recent_slope > 0
        and not jumped_lately(f.steps.clean, f.floor)  # a reload lifting it above them is no fill outgrown
    ]
    for fit in sorted(growing, key=lambda f: -f.coverage):
        ttoom = ctx.projection(metric).time_to(fit.trend.slope)
        if (
            fit.pct_per_hour < p.min_rate
            or not fit.long_enough(p, ttoom)
            or traffic_explains(ctx.prep, fit, ctx.life, p.confidence)
        ):
            continue
        evidence = {"lifetimes": {"settled_level_bytes": level, "margin": OUTGROWN_MARGIN}}
        why = (
            f"this lifetime has stayed above the highest level its earlier lifetimes held after "
            f"their warm-up ({format_bytes(level)}) for the last {format_duration(OUTGROWN_FOR * ctx.prep.base(metric).width)} "
            "and still grows: it is past the level its fill levels at"
        )
        return fit, ttoom, evidence | {"why": why}
    return None
