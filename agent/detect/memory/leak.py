"""The leak detector: steady growth of the live bytes within one process lifetime.

The series judged is the most specific one present: allocator live bytes, else a JVM's layers
(the heap after GC, the memory outside the heap, direct buffers, metaspace: each projected to its
own ceiling, the earliest deadline reported; agent/detect/memory/jvm.py), else RSS. A fit fires when
its lower envelope grows with Mann-Kendall confidence above `confidence`, faster than
`min_rate`, without decelerating, over enough history for its projection, and when its scale
may speak (see `assess`): hours of growth are also what a daily traffic rise or a slow drift
look like, so the short scale only reports what is urgent.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from agent.core.units import format_bytes, format_duration, format_rate
from agent.detect.memory.context import Context, Projection, leak_layers
from agent.detect.memory.fit import Fit
from agent.detect.memory.growth import at_record, time_to_limit, traffic_explains
from agent.detect.memory.jvm import LAYERS, NATIVE, Layer
from agent.detect.memory.lifetimes import carried, outgrown
from agent.detect.memory.oom import past_the_limit, reported_time_to_oom, saturation_ruled_out
from agent.detect.model import ALLOCATED, JVM_HEAP_AFTER_GC, PYMALLOC, RSS, Observation, State, Verdict
from agent.detect.params import DetectParams
from agent.detect.seasonal import MIN_COVERAGE
from agent.detect.trend import theil_sen

if TYPE_CHECKING:
    from agent.core.types import Severity

CLEAR_DECEL = 0.5  # clear only when the recent slope is below half of `decel_ratio` of the window's
DAILY_STRICTER = 30  # the daily scale needs 30 times less doubt than `confidence` allows (z 4 for 0.999)
YESTERDAY_MARGIN = 2.0  # growth this many times the previous day's whole range is not its daily cycle
SAME_HOURS_MARGIN = 1.0  # ...nor growth by this many times that range more than at the same hours then
IMMINENT = 1 / 6  # before the daily profile is known, the window scale fires only this close to the limit


# RSS growing more than this many times faster than the live heap: the leak is outside the heap
# (a heap leak grows RSS too, up to about 2.5x its live growth while the JVM keeps its free ratio)
NATIVE_DOMINANCE = 4.0


def leak_series(ctx: Context) -> list[str]:
    """The series a leak is judged on, most specific first; a JVM's layers (agent/detect/memory/jvm.py) when
    its memory outside the heap is known."""
    if ctx.present(ALLOCATED):
        # Python's small objects live in pymalloc's arenas, which malloc's figures do not count
        return [ALLOCATED, RSS] if ctx.present(PYMALLOC) else [ALLOCATED]
    if ctx.present(JVM_HEAP_AFTER_GC):
        return leak_layers(ctx) or [JVM_HEAP_AFTER_GC, RSS]
    return [RSS]


def may_speak(fit: Fit, ttoom: float | None, ctx: Context) -> bool:
    """Whether this fit's growth can be told from a daily traffic rise: always once the daily
    profile is known; before, the window scale only when the limit is less than a sixth of the
    horizon away, and the wider scales only after growth through a whole period in each third of
    their span. Urgent growth of the window and half-day scales also speaks when it outgrows the
    day before (`_outgrows_yesterday`).
    The daily scale compares equal times of day, so no daily cycle shows in it."""
    p = ctx.params
    if fit.profile_known:
        return True
    if _urgent(ttoom, p) and _outgrows_yesterday(ctx, fit):
        return True
    if fit.scale == "window":
        return ttoom is not None and ttoom < p.horizon * IMMINENT
    t = fit.trend
    return fit.coverage >= p.season and t.early_slope >= p.decel_ratio * t.slope


def _outgrows_yesterday(ctx: Context, fit: Fit) -> bool:
    """Whether the fit rises more than `YESTERDAY_MARGIN` times the whole range of the floor over
    the period before it, in this lifetime after its warm-up, or more than that whole range above
    what the same hours of that period rose (`SAME_HOURS_MARGIN`): a daily cycle that has not
    been learned yet (that takes three periods) still repeats, and can neither rise further than
    it did the day before nor rise now by more than it did at the same hours then. A fill that
    levels off rose more the day before (it was filling faster), a traffic ramp over days about
    as much."""
    if fit.scale not in ("window", "half-day"):
        return False
    p = ctx.params
    env = ctx.prep.stepped(fit.metric)
    width = env.width
    start = fit.idx[0] * fit.width  # the fit's first bucket, in seconds
    first, end = math.floor((start - p.season) / width + 1e-9), math.floor(start / width + 1e-9)
    if first * width < ctx.lifetime_start + ctx.prep.warmup(ctx.life) - 1e-6:
        return False
    idx, lo = env.floors(ctx.life, first, end)
    if not lo or len(idx) < MIN_COVERAGE * (end - first):  # none: a period shorter than a bucket
        return False
    whole = max(lo) - min(lo)
    rise = fit.trend.slope * fit.coverage
    if rise > YESTERDAY_MARGIN * whole:
        return True
    hours = first + math.ceil(fit.coverage / width - 1e-9)  # the same hours, a period before the fit
    same = [(i * width, v) for i, v in zip(idx, lo, strict=True) if i < hours]
    if len(same) < max(MIN_COVERAGE * (hours - first), 3):
        return False
    then = theil_sen([x for x, _ in same], [v for _, v in same]) * fit.coverage
    return rise - then > SAME_HOURS_MARGIN * whole


def _urgent(ttoom: float | None, p: DetectParams) -> bool:
    """The growth reaches the limit within the horizon."""
    return ttoom is not None and ttoom < p.horizon


def _growing(fit: Fit, p: DetectParams) -> bool:
    return fit.trend.slope > 0 and fit.pct_per_hour >= p.min_rate


def _strong(fit: Fit, p: DetectParams) -> bool:
    """The trend is as confident as firing needs. The daily scale's sign test over 48
    autocorrelated differences, corrected as AR(1), is rougher than Mann-Kendall over independent
    buckets: it must clear a stricter bar."""
    bar = p.confidence if fit.scale != "daily" else 1 - (1 - p.confidence) / DAILY_STRICTER
    return fit.trend.confidence >= bar


def assess(fit: Fit, ctx: Context) -> tuple[State, float | None, bool]:
    """(state, time to OOM, plateauing) for one fit.

    The window scale sees hours: it may only report growth that would reach the limit within
    the horizon (slow drifts also look like growth for hours), and only when `may_speak`.
    """
    p = ctx.params
    if fit.confidence < p.confidence_clear:
        return "clear", None, False
    t = fit.trend
    ttoom = ctx.projection(fit.metric).time_to(t.slope)
    growing = _growing(fit, p)
    strong = _strong(fit, p)
    # growth that levels off (a cache filling to its TTL, a warm-up, log-shaped fragmentation) is a
    # working set, not a leak; the curve is fitted only for growth that would otherwise count
    urgent = _urgent(ttoom, p)
    # growth that is not urgent must also have run through a whole day of the process lifetime:
    # in its first day a working set ratchets up with the traffic peak (glibc arenas), a leak
    # keeps growing when the traffic falls
    settled = ctx.tick - ctx.lifetime_start >= ctx.prep.settle(ctx.life)
    allowed = may_speak(fit, ttoom, ctx) and (urgent or (fit.scale not in ("window", "cycle") and settled))
    enough = fit.long_enough(p, ttoom)
    levelled = (
        strong and growing and t.decel >= p.decel_ratio and enough and allowed and fit.levelling is not None
    )
    steady = t.decel >= p.decel_ratio and not levelled
    plateau = strong and growing and not steady
    if strong and growing and steady and enough and allowed:
        if traffic_explains(ctx.prep, fit, ctx.life, p.confidence):
            return "clear", ttoom, False  # memory follows the requests: bytes per request are flat
        return "firing", ttoom, False
    if t.confidence < p.confidence_clear or not growing or levelled or t.decel < p.decel_ratio * CLEAR_DECEL:
        return "clear", ttoom, plateau
    return "holding", ttoom, plateau


def _corroborated(
    assessed: list[tuple[Fit, State, float | None, bool]], ctx: Context
) -> list[tuple[Fit, State, float | None, bool]]:
    """A fit that fires without urgency needs a second fit of the same series (another scale
    or span) that also sees growth, and none that sees it levelling off; else it only holds.
    One span of a slowly wandering process can look like a slow leak, several rarely do; and a
    cache filling for days bends visibly only over the widest span."""
    p = ctx.params
    out = []
    for fit, state, ttoom, plateau in assessed:
        urgent = _urgent(ttoom, p)
        if state == "firing" and not urgent:
            others = [f for f, *_ in assessed if f is not fit and f.confidence >= p.confidence_clear]
            if (
                not any(f.trend.confidence >= p.confidence_clear and f.trend.slope > 0 for f in others)
                or not at_record(ctx.prep, fit.metric, ctx.life, ctx.tick)
                or any(
                    f.levelling is not None
                    for f in others
                    if f.trend.slope > 0 and f.trend.confidence >= p.confidence_clear
                )
            ):
                state = "holding"
        out.append((fit, state, ttoom, plateau))
    return out


def severity_for(ttoom: float | None, horizon: float, ruled_out: bool) -> Severity:
    """`critical` (remediation acts on it) only when the fit rules saturation out (`ruled_out`)."""
    if ttoom is not None and ttoom < horizon / 4 and ruled_out:
        return "critical"
    if ttoom is not None and ttoom < horizon:
        return "error"
    return "warning"


def judge_leak(ctx: Context) -> Observation:
    candidates = leak_series(ctx)
    layered = NATIVE in candidates  # a JVM's layers: each is judged, the earliest deadline reported
    assessed: list[tuple[Fit, State, float | None, bool]] = []
    for metric in candidates:
        assessed += _corroborated([(fit, *assess(fit, ctx)) for fit in ctx.fits(metric)], ctx)
        if not layered and any(state == "firing" for _, state, _, _ in assessed):
            break
    if not assessed:
        return ctx.observation(
            "leak",
            "unknown",
            f"not enough data in this process lifetime to judge a leak (needs {ctx.params.min_buckets} "
            f"buckets of {format_duration(ctx.params.bucket)} after a warm-up of {format_duration(ctx.params.warmup)})",
        )
    firing = [a for a in assessed if a[1] == "firing"]
    if firing and layered:
        fit, _, ttoom, _ = min(firing, key=lambda a: (a[2] is None, a[2] or 0.0, -a[0].trend.span))
        return _leak_observation(ctx, fit, ttoom, native=fit.metric != JVM_HEAP_AFTER_GC)
    if firing:
        fit, _, ttoom, _ = max(firing, key=lambda a: a[0].trend.span)
        native = fit.metric == RSS and candidates[0] == JVM_HEAP_AFTER_GC and _outgrows_heap(ctx, fit)
        if fit.metric == JVM_HEAP_AFTER_GC:
            fit, ttoom, native = _outgrown_by_rss(ctx, fit, ttoom)
        elif fit.metric == ALLOCATED and ctx.present(PYMALLOC):  # objects in pymalloc's arenas
            fit, ttoom, _ = _outgrown_by_rss(ctx, fit, ttoom)
        return _leak_observation(ctx, fit, ttoom, native=native)
    for metric in candidates:  # what the earlier lifetimes show: a leak cut short, or one above their level
        found = carried(ctx, metric) or outgrown(ctx, metric)
        if found is not None:
            fit, ttoom, evidence = found
            obs = _leak_observation(ctx, fit, ttoom, native=False)
            why = evidence.pop("why")
            return replace(obs, summary=f"{obs.summary}; {why}", evidence=obs.evidence | evidence)
    state: State = "holding" if any(a[1] == "holding" for a in assessed) else "clear"
    risen = [a for a in assessed if a[0].confidence >= ctx.params.confidence_clear]
    if not risen:
        fit = assessed[0][0]
        summary = f"{fit.metric} has not grown steadily over the last {format_duration(fit.coverage)}"
        return ctx.observation("leak", state, summary, evidence={"series": fit.metric})
    fit, _, ttoom, _ = max(risen, key=lambda a: a[0].trend.z)
    evidence = fit.evidence() | {"time_to_oom_seconds": ttoom, "limit_bytes": ctx.limit}
    verdict: Verdict | None
    if any(a[3] for a in assessed):
        # what levels: the trend's own recent slope, else the curve fitted beside it
        plateau = next(a[0] for a in assessed if a[3])
        curve = plateau.levelling if plateau.trend.decel >= ctx.params.decel_ratio else None
        now = curve.rate_now / curve.mean_rate if curve is not None else plateau.trend.decel
        summary = f"{plateau.metric} grew but is levelling off (recent slope {now:.0%} of the window's)"
        verdict = "working-set-plateau"
    else:
        summary = _not_a_leak(ctx, fit, ttoom)
        verdict = None
    return ctx.observation("leak", state, summary, verdict=verdict, evidence=evidence)


def _not_a_leak(ctx: Context, fit: Fit, ttoom: float | None) -> str:
    """What the fit that grows most firmly says when no fit fires: no steady growth, or growth as
    firm as firing needs that is held back, and why (a summary must not deny its own figures)."""
    p = ctx.params
    figures = f"{fit.pct_per_hour:+.3f} %/h, confidence {fit.trend.confidence:.3f}"
    if not (_strong(fit, p) and _growing(fit, p)):
        return f"no steady growth of {fit.metric} ({figures})"
    if traffic_explains(ctx.prep, fit, ctx.life, p.confidence):
        why = "it follows the requests (bytes per request are flat)"
    elif not fit.long_enough(p, ttoom):
        why = f"its {fit.scale} fit spans {format_duration(fit.coverage)}, less than a projection needs"
    else:
        why = (
            "growth must show on a second scale at a record level and, unless the limit is near, "
            "through a whole period of the lifetime with its daily cycle known (or, within the horizon "
            "of the limit, rise more than twice the range of the day before)"
        )
    return f"{fit.metric} grows ({figures}) but is not yet a leak: {why}"


def _outgrown_by_rss(ctx: Context, heap: Fit, ttoom: float | None) -> tuple[Fit, float | None, bool]:
    """A JVM whose live heap grows a little while its RSS grows many times faster leaks outside the
    heap (objects that own native memory are small on the heap): the RSS growth is the leak to report.
    So does a Python process whose malloc figures grow a little while its small objects fill
    pymalloc's arenas.
    The heap's fit has already decided that there is a leak; RSS need only be seen rising (the
    clearing bar: its fits often span fewer buckets than the heap's)."""
    p = ctx.params
    heap_rate = max(heap.trend.slope, _envelope_rate(heap), 0.0)
    rising = [
        fit
        for fit in ctx.fits(RSS)
        if fit.trend.confidence >= p.confidence_clear and fit.trend.slope > NATIVE_DOMINANCE * heap_rate
    ]
    if not rising:
        return heap, ttoom, False
    fit = max(rising, key=lambda f: f.trend.span)
    return fit, time_to_limit(ctx.limit, ctx.peak, fit.trend.slope), True


def _outgrows_heap(ctx: Context, rss: Fit) -> bool:
    """RSS fired while the heap after GC did not: outside the heap only when the heap's own growth,
    steps and all, is a fraction of it (a heap with too few samples yet, or one that rose in jumps,
    grows with its RSS); a heap not seen at all cannot tell."""
    rates = [max(f.trend.slope, _envelope_rate(f)) for f in ctx.fits(JVM_HEAP_AFTER_GC)]
    return bool(rates) and rss.trend.slope > NATIVE_DOMINANCE * max(*rates, 0.0)


def _envelope_rate(fit: Fit) -> float:
    """The fit's rise per second from its first to its last floor, steps and all: a heap after GC
    grows in collection-sized jumps that the trend removes as steps, and compared with that stepless
    slope the smoothly growing RSS of the same heap looked many times faster."""
    floors = fit.floors if fit.floors is not None else fit.ys
    if len(floors) < 2 or fit.idx[-1] <= fit.idx[0]:
        return 0.0
    return (floors[-1] - floors[0]) / ((fit.idx[-1] - fit.idx[0]) * fit.width)


def _leak_observation(ctx: Context, fit: Fit, ttoom: float | None, native: bool) -> Observation:
    t = fit.trend
    projection = ctx.projection(fit.metric)
    layer = LAYERS.get(fit.metric)
    layered = layer is not None and projection.layer is not None
    above = not layered and ttoom is not None and ttoom <= 0
    if layer is not None and layered:
        summary = f"{ctx.prep.instance} leaks {layer.title}: " + _layer_text(layer, projection, fit, ttoom)
    else:
        where = " outside the Java heap" if native else ""
        summary = f"{ctx.prep.instance} leaks {format_bytes(t.slope * 3600)}/h ({fit.pct_per_hour:.2f} %/h) in {fit.metric}{where}"
        if above:
            summary += f"; its peaks are already at or above its limit {format_bytes(ctx.limit)}{past_the_limit(ctx)}"
        elif ttoom is not None:
            summary += f"; projected OOM in {format_duration(ttoom)} against {projection.against}"
    summary += f"; confidence {t.confidence:.3f}"
    soon = ttoom is not None and ttoom < ctx.params.horizon / 4  # the reach test only where it can matter
    evidence = fit.evidence() | {
        "time_to_oom_seconds": ttoom if layered else reported_time_to_oom(ctx, ttoom),
        "above_limit": above,
        "limit_bytes": projection.limit,
        "peak_bytes": projection.start,
        "lifetime_start": ctx.lifetime_start,
        "outside_java_heap": native,
        "layer": projection.layer,
        "ceiling": projection.against,
        "ceiling_bytes": projection.ceiling,
        "ends_in": projection.ends,
    }
    return ctx.observation(
        "leak",
        "firing",
        summary,
        severity=severity_for(
            ttoom, ctx.params.horizon, soon and saturation_ruled_out(ctx, fit, projection.start)
        ),
        verdict="leak",
        evidence=evidence,
    )


def _layer_text(layer: Layer, projection: Projection, fit: Fit, ttoom: float | None) -> str:
    """`java.lang.OutOfMemoryError: Java heap space in 2h10m: heap after GC grows 12.0 MiB/min towards
    -Xmx 384.0 MiB` (the ending first, when the growth is projected to reach it)."""
    growth = f"{layer.series_title} grows {format_rate(fit.trend.slope)} towards {projection.against}"
    if ttoom is None:
        return f"{growth} (not projected to reach it)"
    return f"{projection.ends} in {format_duration(ttoom)}: {growth}"
