"""The fragmentation detector: memory resident far above the live bytes, for a sustained window.

From allocator statistics: resident (allocator resident, else RSS) over allocated. When the
allocator also reports active pages, the excess splits into free space inside pages that hold
live objects (fragmentation: a purge cannot return it) and free pages the allocator keeps
(retention: a purge or trim returns them). From a JVM: RSS over heap after GC, which is heap
committed beyond the live set plus the JVM's own native memory. Without either it says that it
cannot judge.

Leak and fragmentation are exclusive explanations of the same memory unless the evidence shows both.
While a leak fires, a JVM's RSS over its heap is the leak (native growth outside the heap, or the heap
itself), never "heap it does not use": no fragmentation finding; nor while its RSS keeps rising (the
leak detector is still confirming it). With allocator figures, fragmentation
fires beside a leak only when the excess was already there at the start of the window, before the
leak's growth; the finding then says which dominates (excess bytes against the leak's growth over the
window) and by how much, and `note_both` writes the same into the leak's observation.
"""

from __future__ import annotations

import math
from typing import TypedDict

from agent.core.units import format_bytes
from agent.detect.memory.context import Context
from agent.detect.memory.jvm import HEAP_COMMITTED, HEAP_MAX
from agent.detect.model import (
    ACTIVE,
    ALLOCATED,
    JVM_HEAP_AFTER_GC,
    RESIDENT,
    RSS,
    Observation,
    State,
    Verdict,
)
from agent.detect.trend import median

CLEAR_FRACTION = 0.8  # clear when ratio excess or bytes fall below 80 % of the firing thresholds


def judge_fragmentation(ctx: Context, leak: Observation | None = None) -> Observation:
    """The fragmentation observation at `ctx.tick`, given the leak observation of the same tick."""
    p = ctx.params
    leaking = leak is not None and leak.state == "firing"
    if ctx.present(ALLOCATED):
        live, resident, ratio_needed, jvm = (
            ALLOCATED,
            RESIDENT if ctx.present(RESIDENT) else RSS,
            p.frag_ratio,
            False,
        )
    elif ctx.present(JVM_HEAP_AFTER_GC) and ctx.present(HEAP_COMMITTED):
        return _jvm_sizes_its_heap(ctx)
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

    def fires(sample: list[tuple[float, float]]) -> bool:
        rs = [r / lv for r, lv in sample]
        return (
            median(rs) >= ratio_needed
            and min(rs) >= 1 + (ratio_needed - 1) / 2
            and median([r - lv for r, lv in sample]) >= p.frag_min_bytes
        )

    firing = fires(pairs)
    # memory that keeps growing is not memory kept: a JVM's excess over its heap that rises is native
    # growth (direct buffers, Deflaters: live native allocations), not unused heap; resident memory
    # that rises with the live bytes is live allocations, not free pages
    # (once the leak fires, what was there before its growth is judged below)
    growing = (not leaking and _live_growth(pairs, jvm)) or (jvm and _grows(ctx))
    firing = firing and not growing
    both = None
    if leaking and firing:
        # the leak explains the excess unless it was there before the leak's growth in this window
        firing = not jvm and fires(pairs[: p.min_buckets])
        if firing and leak is not None:
            both = _dominance(median([r - lv for r, lv in pairs[: p.min_buckets]]), leak, p.window)
            evidence["both"] = both
    if firing:
        what = "allocator retention" if verdict == "allocator-retention" else "fragmentation"
        summary = (
            f"{ctx.prep.instance}: {what}: {format_bytes(resident_bytes)} resident for {format_bytes(live_bytes)} "
            f"live ({ratio:.1f}x); {advice}"
        )
        if both is not None:
            summary += f"; beside a leak: {both['text']}"
        return ctx.observation("fragmentation", "firing", summary, "warning", verdict, evidence)
    clear_ratio = 1 + CLEAR_FRACTION * (ratio_needed - 1)
    state: State = (
        "clear" if leaking or ratio < clear_ratio or excess < CLEAR_FRACTION * p.frag_min_bytes else "holding"
    )
    summary = f"resident {format_bytes(resident_bytes)} for {format_bytes(live_bytes)} live ({ratio:.2f}x)"
    if growing and not leaking:
        summary += (
            ": the memory above the heap grows (native allocations), not heap the JVM keeps"
            if jvm
            else ": the live bytes grow with it (live allocations), not free memory the allocator keeps"
        )
        return ctx.observation("fragmentation", "holding", summary, evidence=evidence)
    if leaking:
        summary = (
            "the memory above the heap is the leak's growth, not heap the JVM keeps"
            if jvm
            else f"{summary}: the excess came with the leak's growth"
        )
    return ctx.observation(
        "fragmentation", state, summary, verdict=verdict if state == "holding" else None, evidence=evidence
    )


LIVE_SHARE = 0.5  # the live bytes rising by this share of the resident rise: the growth is live


def _live_growth(pairs: list[tuple[float, float]], jvm: bool) -> bool:
    """Whether the resident memory rises over the window (its last third's median above its first
    third's) by live allocations: for a JVM, the excess over the heap rises by more than a tenth
    (native memory the heap does not show); with allocator figures, the live bytes rise by at least
    `LIVE_SHARE` of the resident rise."""
    third = len(pairs) // 3
    if third < 2:
        return False
    early, late = pairs[:third], pairs[-third:]
    resident_rise = median([r for r, _ in late]) - median([r for r, _ in early])
    live_rise = median([lv for _, lv in late]) - median([lv for _, lv in early])
    if jvm:
        excess = median([r - lv for r, lv in early])
        return resident_rise - live_rise > 0.1 * max(excess, 0.0)
    return resident_rise > 0 and live_rise >= LIVE_SHARE * resident_rise


def _jvm_sizes_its_heap(ctx: Context) -> Observation:
    """A JVM whose committed heap is known: heap committed above the live floor is the JVM's own sizing
    within `-Xmx` (it grows the heap as the GC sawtooth widens, and keeps it), and what lies outside the
    heap is the native layer the leak detector judges: neither is memory a purge or a restart returns."""
    committed = ctx.peak_of(HEAP_COMMITTED)
    live = ctx.floor_of(JVM_HEAP_AFTER_GC)
    ceiling = ctx.ceiling(HEAP_MAX)
    within = f" within -Xmx {format_bytes(ceiling)}" if ceiling is not None else ""
    summary = (
        f"the JVM sizes its heap itself: {format_bytes(committed)} committed for {format_bytes(live)} live "
        f"after GC{within}; not fragmentation"
    )
    evidence = {"heap_committed_bytes": committed, "live_bytes": live, "heap_max_bytes": ceiling}
    return ctx.observation("fragmentation", "clear", summary, evidence=evidence)


def _grows(ctx: Context) -> bool:
    """Whether RSS rises steadily on some scale: excess memory that grows is not memory kept."""
    p = ctx.params
    return any(
        fit.trend.slope > 0
        and fit.confidence >= p.confidence_clear
        and fit.trend.confidence >= p.confidence_clear
        for fit in ctx.fits(RSS)
    )


class Dominance(TypedDict):
    """Evidence `both`: which of fragmentation and a leak holds more memory, and by how much."""

    dominant: str  # "fragmentation" | "leak"
    excess_bytes: float
    leak_growth_bytes: float
    factor: float | None
    text: str


def _dominance(excess: float, leak: Observation, window: float) -> Dominance:
    """Which of two present explanations holds more memory: the excess over the live bytes, or what the
    leak added over the window."""
    slope = leak.evidence.get("slope_bytes_per_second") or 0.0
    grown = max(0.0, slope * window)
    dominant = "fragmentation" if excess >= grown else "leak"
    big, small = max(excess, grown), min(excess, grown)
    factor = big / small if small > 0 else None
    by = f"{factor:.1f}x" if factor is not None else "entirely"
    return {
        "dominant": dominant,
        "excess_bytes": excess,
        "leak_growth_bytes": grown,
        "factor": factor,
        "text": (
            f"{dominant} dominates ({by}): {format_bytes(excess)} free in the allocator against "
            f"{format_bytes(grown)} leaked over the window"
        ),
    }


def note_both(leak: Observation, frag: Observation) -> None:
    """Tell the leak's observation that fragmentation is present too, and which dominates."""
    both = frag.evidence.get("both")
    if leak.state == "firing" and frag.state == "firing" and both is not None:
        leak.evidence["both"] = both
        leak.summary += f"; beside fragmentation: {both['text']}"


def _split_excess(
    ctx: Context, live: str, first: int, end: int, jvm: bool, excess: float
) -> tuple[Verdict, float | None, str]:
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
            f"up to {format_bytes(excess)} is free inside the allocator; a purge (glibc malloc_trim) returns "
            "the whole free pages among it, and what stays is free space inside partly used pages: if it "
            "comes back, try jemalloc via LD_PRELOAD or MALLOC_ARENA_MAX (per-thread arenas full of holes)",
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
