"""The oom-risk detector: the memory judged against the limit would reach it within the horizon.

Whatever the cause (leak, fragmentation, a working set still growing), the RSS lower envelope
grows with confidence and its peaks, projected at the more cautious of the window's slope and
the recent slope, reach the limit before `horizon`. This is the safety net of a process of any
age: it is gated on the quality of the fit (`fit_holds`), never on having learned a daily
profile, so a new process bound for its limit is flagged in its first hours. The cautious slope
keeps a warm-up that is levelling off from projecting its early rate. A JVM's layers are projected
to their own ceilings instead of its RSS to the limit (`context.oom_series`); the earliest is reported.

Peaks already at or above the limit are no projection: they fire at once and say what that means
(`above_limit`). A cgroup limit is enforced: RSS cannot run past it, the kernel reclaims and swaps
there and OOM-kills when it can do no more, so the time to OOM is 0. A limit set only in medic's
config is not enforced: the process runs on past it and when the kernel would kill it is not known,
so the time to OOM is unknown (None), never 0 for a process that keeps running.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agent.core.units import format_bytes, format_duration, format_rate
from agent.detect.memory.context import Context, oom_series
from agent.detect.memory.fit import Fit
from agent.detect.memory.growth import time_to_limit, traffic_explains
from agent.detect.memory.jvm import LAYERS
from agent.detect.memory.saturation import Levelling, reach_bar
from agent.detect.model import Observation, State
from agent.detect.params import DetectParams

if TYPE_CHECKING:
    from agent.core.types import Severity

CLEAR_MARGIN = 1.5  # resolve only once the projection is beyond 1.5 × horizon
STEADY = 0.9  # with no daily profile, a fit's first and last thirds grow at this fraction of its slope


def fit_holds(fit: Fit, ttoom: float, p: DetectParams) -> bool:
    """Whether the fit is good enough to project `ttoom`: growth that does not decelerate, over
    at least `ttoom / max_extrapolation` once the daily profile is known. Before it is known, no
    further ahead than the growth already seen (a daily rise lasts half a period at most, and a
    working set filling up runs as long as it runs: what has not been seen cannot be projected),
    and steady in its first and last thirds (a daily rise is slow at its trough and its peak; a
    trajectory to the limit is not) unless the limit is under a quarter of the horizon away."""
    t = fit.trend
    if t.decel < p.decel_ratio:
        return False
    if fit.profile_known:
        return fit.long_enough(p, ttoom)
    if fit.coverage < ttoom - 1e-6:
        return False
    return ttoom < p.horizon / 4 or (t.early_slope >= STEADY * t.slope and t.decel >= STEADY)


def saturation_ruled_out(ctx: Context, fit: Fit, start: float | None) -> bool:
    """What a critical severity (one remediation acts on) needs: no levelling curve fits better
    than the line, and every curve that rises from `start` less than the room to the limit within
    a quarter of the horizon is rejected at the detector's confidence (`reach_bar` noise variances
    worse than the best free fit: a margin that scales with the noise, so a working set still
    filling in harsh noise stays an error)."""
    if not fit.saturation_ruled_out:
        return False
    limit = ctx.projection(fit.metric).limit
    if limit is None or start is None:
        return False
    p = ctx.params
    return start >= limit or fit.reach(limit - start, p.horizon / 4) >= reach_bar(p.confidence)


def oom_peak(ctx: Context, fit: Fit) -> float | None:
    """Where the peaks start the projection from: now, plus on the cycle scale the part of the
    fitted daily swing still to come today (the upper envelope covers the daily peak)."""
    peak = ctx.projection(fit.metric).start
    if fit.wave and peak is not None:
        peak += max(0.0, fit.wave - fit.offset)
    return peak


WAVE_STEP = 300.0  # seconds between the instants at which the daily wave still to come is read


def peaks_time_to_limit(ctx: Context, fit: Fit, slope: float, curve: Levelling | None = None) -> float | None:
    """Seconds until the peaks reach the limit, rising at `slope` or, when it levels off, by what the
    floor's `curve` still rises (None: it levels off below the limit). On the cycle scale the
    fitted daily wave is still to come: the peaks reach the limit when the wave and the growth
    together first do, not at once because today's daily peak would (`oom_peak` starts from that
    peak, which bounds the time from below); beyond a period, from that daily peak."""
    projection = ctx.projection(fit.metric)
    peak, limit = oom_peak(ctx, fit), projection.limit
    if limit is None or peak is None:
        return None
    soonest = (
        curve.time_to(curve.now + limit - peak) if curve is not None else time_to_limit(limit, peak, slope)
    )
    if soonest is None or not fit.wave or projection.start is None:
        return soonest
    season = ctx.params.season
    t = soonest
    while t < soonest + season:
        rise = curve.rise(t) if curve is not None else slope * t
        if projection.start + fit.wave_ahead(t, season) + rise >= limit:
            return t
        t += WAVE_STEP
    return soonest


def enforced(ctx: Context) -> bool:
    """Whether the kernel enforces the limit: not one set only in medic's config."""
    return ctx.prep.series.limit_source != "config"


def reported_time_to_oom(ctx: Context, ttoom: float | None) -> float | None:
    """The time to OOM a finding reports: 0 at an enforced limit, unknown past a config-only one."""
    return None if ttoom is not None and ttoom <= 0 and not enforced(ctx) else ttoom


def past_the_limit(ctx: Context) -> str:
    """What peaks at or above the limit mean, in words that fit after "…limit 160.0 MiB"."""
    source = ctx.prep.series.limit_source
    if source == "config":
        return (
            ": a limit set only in medic's config, which the kernel does not enforce, so the process runs "
            "on past it (when the kernel would kill it is not known); restart it or raise the limit"
        )
    if source in ("cgroup", "host"):
        what = "its cgroup" if source == "cgroup" else "the host"
        return f" ({what}): the kernel reclaims and swaps what it can there, and OOM-kills when it can do no more"
    return ""


def above_limit(ctx: Context) -> Observation | None:
    """Peaks at or above the limit, said as they are (no projection needed); None below it."""
    peak, limit = ctx.peak, ctx.limit
    if peak is None or limit is None or peak < limit:
        return None
    ttoom = reported_time_to_oom(ctx, 0.0)
    verb = "are above" if peak > limit and not enforced(ctx) else "have reached"
    summary = (
        f"{ctx.prep.instance} RSS peaks {format_bytes(peak)} {verb} its memory limit {format_bytes(limit)} "
        f"({peak / limit:.0%} of it){past_the_limit(ctx)}"
    )
    evidence = {
        "time_to_oom_seconds": ttoom,
        "above_limit": True,
        "limit_bytes": limit,
        "limit_source": ctx.prep.series.limit_source,
        "peak_bytes": peak,
        "lifetime_start": ctx.lifetime_start,
    }
    severity: Severity = "critical" if enforced(ctx) else "error"
    return ctx.observation("oom-risk", "firing", summary, severity=severity, evidence=evidence)


def judge_oom(ctx: Context) -> Observation:
    p = ctx.params
    if ctx.limit is None:
        return ctx.observation(
            "oom-risk",
            "unknown",
            "no memory limit known: configure one, or pass --limit or a memory_limit_bytes series",
        )
    above = above_limit(ctx)
    if above is not None:
        return above
    fits = [fit for metric in oom_series(ctx) for fit in ctx.fits(metric)]
    if not fits:
        return ctx.observation(
            "oom-risk", "unknown", "not enough data in this process lifetime to project RSS"
        )
    best = None
    proven = False
    state: State = "clear"
    for fit in fits:
        if fit.confidence < p.confidence_clear:
            continue
        t = fit.trend
        slope = min(t.slope, t.recent_slope)
        ttoom = peaks_time_to_limit(ctx, fit, slope)
        if ttoom is None:
            continue
        near = t.confidence >= p.confidence_clear and ttoom < p.horizon * CLEAR_MARGIN
        curve = fit.levelling if near else None  # a levelling curve only projects further
        if curve is not None:  # growth levelling off: so does its projection
            ttoom, slope = peaks_time_to_limit(ctx, fit, slope, curve), curve.rate_now
            if ttoom is None:
                continue
        # critical: the raw test at full confidence suffices over twice the time left, or over the
        # time left when the growth accelerates (its curvature is what lowers the corrected test)
        accelerating = t.early_slope <= t.slope and t.decel >= 1.0
        critical = (
            ttoom < p.horizon / 4
            and fit.confidence >= p.confidence
            and fit.coverage >= (1 if accelerating else 2) * ttoom
            and saturation_ruled_out(ctx, fit, oom_peak(ctx, fit))
        )
        if (
            (t.confidence >= p.confidence or (critical and t.confidence >= p.confidence_clear))
            and ttoom < p.horizon
            and fit_holds(fit, ttoom, p)
            and not traffic_explains(ctx.prep, fit, ctx.life, p.confidence)
        ):
            if best is None or state != "firing" or ttoom < best[1]:
                best, state = (fit, ttoom, slope), "firing"
            proven = proven or critical
        elif state != "firing" and t.confidence >= p.confidence_clear and ttoom < p.horizon * CLEAR_MARGIN:
            best, state = (fit, ttoom, slope), "holding"
    if best is None:
        return ctx.observation(
            "oom-risk",
            "clear",
            f"RSS peaks {format_bytes(ctx.peak)} are not projected to reach {format_bytes(ctx.limit)}",
        )
    fit, ttoom, slope = best
    projection = ctx.projection(fit.metric)
    evidence = fit.evidence() | {
        "time_to_oom_seconds": ttoom,
        "projection_slope_bytes_per_second": slope,
        "limit_bytes": projection.limit,
        "peak_bytes": projection.start,
        "lifetime_start": ctx.lifetime_start,
        "layer": projection.layer,
        "ceiling": projection.against,
        "ceiling_bytes": projection.ceiling,
        "ends_in": projection.ends,
    }
    layer = LAYERS.get(fit.metric)
    if layer is not None and projection.layer is not None:
        summary = (
            f"{ctx.prep.instance}: {projection.ends} in {format_duration(ttoom)}: {layer.series_title} "
            f"{format_bytes(projection.start)} grows {format_rate(slope)} towards {projection.against}"
        )
    else:
        summary = (
            f"{ctx.prep.instance} RSS peaks {format_bytes(ctx.peak)} projected to reach the limit "
            f"{format_bytes(ctx.limit)} in {format_duration(ttoom)} (+{format_bytes(slope * 3600)}/h)"
        )
    severity: Severity = (
        "critical"
        if ttoom < p.horizon / 4 and (proven or saturation_ruled_out(ctx, fit, oom_peak(ctx, fit)))
        else "error"
    )
    return ctx.observation("oom-risk", state, summary, severity=severity, evidence=evidence)
