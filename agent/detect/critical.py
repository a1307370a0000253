"""Critical: the memory reaches its limit within the horizon, shown, not assumed.

Remediation restarts only for a critical `leak` or `oom-risk` finding, so critical is a
statistical statement: on some scale of the series the curves that stay below the limit over
the horizon (slower lines, and every levelling curve of `agent.detect.reach`) are rejected at
`FALSE_RATE`, shared among the scales tested (Bonferroni), on a fit that spans at least the
time to OOM over `max_extrapolation` (growth seen over a real fraction of what is projected).
Everything else that fires is an error or a warning: shown, watched, not restarted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from agent.core.units import format_duration
from agent.detect.context import Context
from agent.detect.growth import Fit
from agent.detect.reach import FALSE_RATE, Reach

PROFILE_Z = 3.7  # the profile's rise counts at its one-sided 10⁻⁴ lower bound, like the test
BURST_BUCKETS = 3  # a burst lasts up to this many buckets of the window scale (45 min at the defaults)


@dataclass(frozen=True, slots=True)
class Critical:
    """Whether a series' growth reaches the limit within the horizon, and the evidence either way."""

    reaches: bool
    why: str  # what rules it in, or what keeps it from critical
    evidence: dict[str, Any]


def critical_reach(ctx: Context, metric: str, ttoom: float) -> Critical:
    """The reach test on every fit of `metric` that spans enough: critical when one of them rejects
    the curves that stay below the limit at `FALSE_RATE` over the number of fits tested, among
    the fits that may project the point estimate `ttoom` (`Fit.long_enough`). The room
    left is the ceiling less where the series is now (`Context.projection`: the RSS peaks against
    the memory limit, a JVM's layer against its own ceiling), less what a learned daily profile still rises within
    the horizon on a fit it was removed from (a sine fitted without a profile is a projection, not
    evidence: it leaves the room whole)."""
    p = ctx.params
    projection = ctx.projection(metric)  # a JVM's layer against its own ceiling
    limit, peak = projection.limit, projection.start
    if limit is None or peak is None:
        return Critical(False, f"no ceiling known for {metric}: {projection.against}", {})
    tested: list[tuple[Fit, Reach]] = []
    for fit in ctx.fits(metric):
        if fit.scale == "daily" or not fit.long_enough(p, ttoom):
            continue
        if not fit.profile_known and fit.basis is None and fit.coverage < p.season / 2:
            continue  # hours of a day with no profile learned: a daily rise and growth look alike
        room = limit - peak - (_daily_rise(ctx, fit) if fit.seasonal else 0.0)
        found = fit.reach(room, p.horizon, p.season)
        if found is None or not found.reaches:
            if found is not None:
                tested.append((fit, found))
            continue
        # a burst (a batch, a load spike) lifts the floor of the newest buckets for up to
        # `BURST_BUCKETS` of the window scale, and looks like growth that just began: the evidence
        # must hold without them too (the shorter series must rise as far: the stricter test)
        drop = math.ceil(BURST_BUCKETS * p.bucket / fit.width - 1e-9)
        older = fit.reach(room, p.horizon, p.season, len(fit.idx) - drop)
        tested.append((fit, found if older is None else max(found, older, key=lambda r: r.p_value)))
    if not tested:
        return Critical(
            False,
            f"levelling not ruled out: no fit spans {format_duration(ttoom / p.max_extrapolation)} "
            "with enough buckets to test it",
            {},
        )
    fit, best = max(tested, key=lambda t: t[1].stat)
    p_value = min(1.0, best.p_value * len(tested))
    evidence = {
        "p_value": p_value,
        "false_rate": FALSE_RATE,
        "scale": fit.scale,
        "span_seconds": fit.coverage,
        "closest_below": best.shape,
        "autocorrelation": round(best.rho, 3),
    }
    within = format_duration(p.horizon)
    if p_value <= FALSE_RATE:
        why = (
            f"no curve that stays below the limit fits the {fit.scale} scale "
            f"({format_duration(fit.coverage)}; p {p_value:.1g}): the limit is reached within {within}"
        )
        return Critical(True, why, evidence)
    why = (
        f"levelling not ruled out: a curve that stays below the limit for {within} ({best.shape}) "
        f"fits the {fit.scale} scale with p {p_value:.2g} (critical needs {FALSE_RATE:g})"
    )
    return Critical(False, why, evidence)


def _daily_rise(ctx: Context, fit: Fit) -> float:
    """How far the daily profile removed from `fit` still rises within the horizon above where it
    is now: the peaks reach the limit by the trend and the day's swing together, and the trend
    need only cover the rest (0 when the profile does not rise, or is not known)."""
    p = ctx.params
    env = ctx.prep.base(fit.metric)
    profile = ctx.prep.profile(fit.metric, ctx.tick, env, ctx.life)
    if profile is None or profile.amplitude <= 0:
        return 0.0
    table, width = profile.values, env.width
    end = math.floor(ctx.tick / width + 1e-9) - 1  # the last complete bucket
    ahead = range(end + 1, end + 1 + max(1, round(p.horizon / width)))
    rise = max(table[b % len(table)] for b in ahead) - table[end % len(table)]
    # its lower bound: each slot is a median of `days` values (standard error ~1.25 noise/√days),
    # and the largest of many noisy slots ahead is biased up
    rise -= PROFILE_Z * math.sqrt(2) * 1.25 * profile.noise / math.sqrt(max(profile.days, 1))
    if profile.relative:  # a workload's prior: fractions of the fit's level
        rise *= fit.level - fit.offset
    return max(rise, 0.0)
