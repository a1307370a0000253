"""The fragmentation detector: memory resident far above the live bytes, for a sustained window.

From allocator statistics: resident (allocator resident, else RSS) over allocated. When the
allocator also reports active pages, the excess splits into free space inside pages that hold
live objects (fragmentation: a purge cannot return it) and free pages the allocator keeps
(retention: a purge or trim returns them). From a JVM: RSS over heap after GC, which is heap
committed beyond the live set plus the JVM's own native memory. Without either it says that it
cannot judge.
"""

from __future__ import annotations

import math

from agent.core.units import format_bytes
from agent.detect.context import Context
from agent.detect.model import ACTIVE, ALLOCATED, JVM_HEAP_AFTER_GC, RESIDENT, RSS, Observation
from agent.detect.trend import median

CLEAR_FRACTION = 0.8  # clear when ratio excess or bytes fall below 80 % of the firing thresholds


def judge_fragmentation(ctx: Context, live_leaking: bool) -> Observation:
    p = ctx.params
    if ctx.present(ALLOCATED):
        live, resident, ratio_needed, jvm = (
            ALLOCATED,
            RESIDENT if ctx.present(RESIDENT) else RSS,
            p.frag_ratio,
            False,
        )
    elif ctx.present(JVM_HEAP_AFTER_GC):
        live, resident, ratio_needed, jvm = JVM_HEAP_AFTER_GC, RSS, p.frag_ratio_jvm, True
    else:
        return ctx.observation(
            "fragmentation",
            "unknown",
            "cannot judge fragmentation: no allocator statistics (allocator_allocated_bytes) and no JVM "
            "heap after GC for this instance; enable the allocator hook or LD_PRELOAD shim",
        )
    width = p.bucket
    end = math.floor(ctx.tick / width + 1e-9)
    first = max(math.ceil((ctx.lifetime_start + p.warmup) / width - 1e-9), end - round(p.window / width))
    live_idx, _, live_hi = ctx.prep.base(live).select(ctx.life, first, end)
    res_idx, res_lo, _ = ctx.prep.base(resident).select(ctx.life, first, end)
    res_by_bucket = dict(zip(res_idx, res_lo))
    pairs = [(res_by_bucket[b], hi) for b, hi in zip(live_idx, live_hi) if b in res_by_bucket and hi > 0]
    if len(pairs) < p.min_buckets:
        return ctx.observation("fragmentation", "unknown", "not enough allocator data in this lifetime yet")
    ratios = [r / lv for r, lv in pairs]
    ratio = median(ratios)
    excess = median([r - lv for r, lv in pairs])
    live_bytes = median([lv for _, lv in pairs])
    resident_bytes = median([r for r, _ in pairs])
    evidence = {
        "live_series": live,
        "resident_series": resident,
        "ratio": ratio,
        "min_ratio": min(ratios),
        "live_bytes": live_bytes,
        "resident_bytes": resident_bytes,
        "excess_bytes": excess,
        "points": len(pairs),
    }
    verdict, reclaimable, advice = _split_excess(ctx, live, first, end, jvm, excess)
    evidence |= {"reclaimable_bytes": reclaimable, "advice": advice}
    firing = (
        not live_leaking
        and ratio >= ratio_needed
        and min(ratios) >= 1 + (ratio_needed - 1) / 2
        and excess >= p.frag_min_bytes
    )
    if firing:
        what = "allocator retention" if verdict == "allocator-retention" else "fragmentation"
        summary = (
            f"{ctx.prep.instance}: {what}: {format_bytes(resident_bytes)} resident for {format_bytes(live_bytes)} "
            f"live ({ratio:.1f}x); {advice}"
        )
        return ctx.observation("fragmentation", "firing", summary, "warning", verdict, evidence)
    clear_ratio = 1 + CLEAR_FRACTION * (ratio_needed - 1)
    state = (
        "clear"
        if live_leaking or ratio < clear_ratio or excess < CLEAR_FRACTION * p.frag_min_bytes
        else "holding"
    )
    summary = f"resident {format_bytes(resident_bytes)} for {format_bytes(live_bytes)} live ({ratio:.2f}x)"
    return ctx.observation(
        "fragmentation", state, summary, verdict=verdict if state == "holding" else None, evidence=evidence
    )


def _split_excess(
    ctx: Context, live: str, first: int, end: int, jvm: bool, excess: float
) -> tuple[str, float | None, str]:
    """(verdict, bytes a purge/trim could return, advice)."""
    if jvm:
        return (
            "allocator-retention",
            None,
            "the JVM keeps heap it does not use (plus its native memory); consider a smaller -Xmx or "
            "-XX:MaxHeapFreeRatio, or periodic uncommit (G1PeriodicGCInterval)",
        )
    if not ctx.present(ACTIVE):
        return (
            "fragmentation",
            None,
            f"up to {format_bytes(excess)} is free inside the allocator; a trim returns only whole free pages "
            "(glibc malloc_trim), so try jemalloc via LD_PRELOAD or MALLOC_ARENA_MAX",
        )
    act_idx, act_lo, _ = ctx.prep.base(ACTIVE).select(ctx.life, first, end)
    res_metric = RESIDENT if ctx.present(RESIDENT) else RSS
    res_idx, res_lo, _ = ctx.prep.base(res_metric).select(ctx.life, first, end)
    live_idx, live_lo, _ = ctx.prep.base(live).select(ctx.life, first, end)
    act = dict(zip(act_idx, act_lo))
    live_by = dict(zip(live_idx, live_lo))
    retained, internal = [], []
    for b, res in zip(res_idx, res_lo):
        if b in act and b in live_by:
            retained.append(max(0.0, res - act[b]))
            internal.append(max(0.0, act[b] - live_by[b]))
    if not retained:
        return "fragmentation", None, "allocator active pages unknown in this window"
    kept, frag = median(retained), median(internal)
    if kept >= frag:
        return (
            "allocator-retention",
            kept,
            f"a purge/trim should return about {format_bytes(kept)}; consider "
            "MALLOC_CONF=background_thread:true,dirty_decay_ms:5000",
        )
    return (
        "fragmentation",
        kept,
        f"{format_bytes(frag)} is free space inside partly used pages, which a purge cannot return; "
        f"a purge returns about {format_bytes(kept)}",
    )
