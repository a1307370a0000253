"""The oom-risk detector: the memory judged against the limit would reach it within the horizon.

Whatever the cause (leak, fragmentation, a working set still growing), the RSS lower envelope
grows with confidence and its peaks, projected at the more cautious of the window's slope and
the recent slope, reach the limit before `horizon`. The cautious slope keeps a warm-up that is
levelling off from projecting its early rate; like a leak, growth that a daily traffic rise could
explain does not count until the daily profile is known (`leak.may_speak`).
"""

from __future__ import annotations

from agent.core.units import format_bytes, format_duration
from agent.detect.context import Context
from agent.detect.growth import time_to_limit
from agent.detect.leak import may_speak
from agent.detect.model import RSS, Observation, State

CLEAR_MARGIN = 1.5  # resolve only once the projection is beyond 1.5 × horizon


def judge_oom(ctx: Context) -> Observation:
    p = ctx.params
    if ctx.limit is None:
        return ctx.observation(
            "oom-risk",
            "unknown",
            "no memory limit known: configure one, or pass --limit or a memory_limit_bytes series",
        )
    fits = ctx.fits(RSS)
    if not fits:
        return ctx.observation(
            "oom-risk", "unknown", "not enough data in this process lifetime to project RSS"
        )
    best = None
    state: State = "clear"
    for fit in fits:
        if fit.confidence < p.confidence_clear:
            continue
        t = fit.trend
        slope = min(t.slope, t.recent_slope)
        ttoom = time_to_limit(ctx.limit, ctx.peak, slope)
        if ttoom is None:
            continue
        if (
            t.confidence >= p.confidence
            and ttoom < p.horizon
            and fit.long_enough(p, ttoom)
            and may_speak(fit, ttoom, p)
        ):
            if best is None or state != "firing" or ttoom < best[1]:
                best, state = (fit, ttoom, slope), "firing"
        elif state != "firing" and t.confidence >= p.confidence_clear and ttoom < p.horizon * CLEAR_MARGIN:
            best, state = (fit, ttoom, slope), "holding"
    if best is None:
        return ctx.observation(
            "oom-risk",
            "clear",
            f"RSS peaks {format_bytes(ctx.peak)} are not projected to reach {format_bytes(ctx.limit)}",
        )
    fit, ttoom, slope = best
    evidence = fit.evidence() | {
        "time_to_oom_seconds": ttoom,
        "projection_slope_bytes_per_second": slope,
        "limit_bytes": ctx.limit,
        "peak_bytes": ctx.peak,
        "lifetime_start": ctx.lifetime_start,
    }
    summary = (
        f"{ctx.prep.instance} RSS peaks {format_bytes(ctx.peak)} projected to reach the limit "
        f"{format_bytes(ctx.limit)} in {format_duration(ttoom)} (+{format_bytes(slope * 3600)}/h)"
    )
    severity = "critical" if ttoom < p.horizon / 4 else "error"
    return ctx.observation("oom-risk", state, summary, severity=severity, evidence=evidence)
