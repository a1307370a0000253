"""Fragmentation, allocator retention and the verdict that tells them from a leak."""

from __future__ import annotations

import random

from agent.detect import InstanceSeries, analyze_instance, evaluate
from support.detect_shapes import DAY, PARAMS, T0, kinds, series

MiB = 2**20


def _flat(value: float, days: float, every: float = 5.0, grow_per_day: float = 0.0, seed: int = 0) -> list:
    rng = random.Random(seed)
    return [
        (T0 + t, value + grow_per_day * t / DAY + rng.gauss(0, 0.002 * value))
        for t in range(0, int(days * DAY), int(every))
    ]


def _instance(days: float = 2.0, limit: float = 4096 * MiB, **metrics) -> InstanceSeries:
    return InstanceSeries("alloc", {m: pts for m, pts in metrics.items()}, restarts=[], memory_limit=limit)


def test_resident_far_above_flat_live_bytes_is_fragmentation_without_active_pages():
    s = _instance(
        rss_bytes=_flat(1200 * MiB, 2),
        allocator_allocated_bytes=_flat(300 * MiB, 2),
        allocator_resident_bytes=_flat(1150 * MiB, 2),
    )
    frag = next(f for f in analyze_instance(s, PARAMS).findings if f.kind == "fragmentation")
    assert frag.verdict == "fragmentation"
    assert 3.5 < frag.evidence["ratio"] < 4.2
    assert frag.evidence["reclaimable_bytes"] is None  # glibc-like: a trim may return little
    assert "trim" in frag.evidence["advice"]


def test_free_pages_kept_by_the_allocator_are_retention_a_purge_returns():
    s = _instance(
        rss_bytes=_flat(1100 * MiB, 2),
        allocator_allocated_bytes=_flat(300 * MiB, 2),
        allocator_active_bytes=_flat(330 * MiB, 2),
        allocator_resident_bytes=_flat(1024 * MiB, 2),
    )
    frag = next(f for f in analyze_instance(s, PARAMS).findings if f.kind == "fragmentation")
    assert frag.verdict == "allocator-retention"
    assert 600 * MiB < frag.evidence["reclaimable_bytes"] < 760 * MiB


def test_free_space_inside_partly_used_pages_is_fragmentation_a_purge_cannot_return():
    s = _instance(
        rss_bytes=_flat(1000 * MiB, 2),
        allocator_allocated_bytes=_flat(300 * MiB, 2),
        allocator_active_bytes=_flat(900 * MiB, 2),
        allocator_resident_bytes=_flat(950 * MiB, 2),
    )
    frag = next(f for f in analyze_instance(s, PARAMS).findings if f.kind == "fragmentation")
    assert frag.verdict == "fragmentation"
    assert frag.evidence["reclaimable_bytes"] < 100 * MiB


def test_growing_live_bytes_are_a_leak_on_the_allocator_series_and_not_fragmentation():
    s = _instance(
        days=3,
        rss_bytes=_flat(1400 * MiB, 3, grow_per_day=900 * MiB),
        allocator_allocated_bytes=_flat(300 * MiB, 3, grow_per_day=900 * MiB),
        allocator_resident_bytes=_flat(1300 * MiB, 3, grow_per_day=900 * MiB),
    )
    result = analyze_instance(s, PARAMS)
    leak = next(f for f in result.findings if f.kind == "leak")
    assert leak.evidence["series"] == "allocator_allocated_bytes"
    assert leak.verdict == "leak"
    frag_opened = [f for f in result.findings if f.kind == "fragmentation" and f.opened_at > leak.opened_at]
    assert not frag_opened


def test_rss_growing_over_flat_live_bytes_is_not_a_leak_and_its_oom_risk_says_fragmentation():
    s = _instance(
        days=3,
        rss_bytes=_flat(1200 * MiB, 3, grow_per_day=1500 * MiB),
        allocator_allocated_bytes=_flat(300 * MiB, 3),
        allocator_resident_bytes=_flat(1150 * MiB, 3, grow_per_day=1500 * MiB),
    )
    result = analyze_instance(s, PARAMS)
    assert "leak" not in kinds(result.findings)
    oom = next(f for f in result.findings if f.kind == "oom-risk")
    assert oom.verdict == "fragmentation"


def test_a_jvm_keeping_heap_it_does_not_use_is_retention_and_a_heap_leak_is_a_leak():
    idle = _instance(rss_bytes=_flat(900 * MiB, 2), jvm_heap_after_gc_bytes=_flat(120 * MiB, 2, every=30))
    frag = next(f for f in analyze_instance(idle, PARAMS).findings if f.kind == "fragmentation")
    assert frag.verdict == "allocator-retention"
    leaking = _instance(
        days=3,
        rss_bytes=_flat(900 * MiB, 3, grow_per_day=1200 * MiB),
        jvm_heap_after_gc_bytes=_flat(120 * MiB, 3, every=30, grow_per_day=1200 * MiB),
    )
    leak = next(f for f in analyze_instance(leaking, PARAMS).findings if f.kind == "leak")
    assert leak.evidence["series"] == "jvm_heap_after_gc_bytes"


def test_without_allocator_statistics_fragmentation_says_it_cannot_judge():
    s = series(days=1)
    frag = next(o for o in evaluate(s, T0 + DAY, PARAMS) if o.kind == "fragmentation")
    assert frag.state == "unknown"
    assert "cannot judge fragmentation" in frag.summary and "allocator" in frag.summary


def test_a_jvm_native_leak_outside_the_heap_is_a_leak_and_never_heap_the_jvm_keeps():
    """RSS grows over a flat heap after GC: the leak fires on RSS outside the Java heap; its RSS far
    above the heap is the leak's growth, so no `allocator-retention` finding sends it to a purge."""
    s = _instance(
        days=3,
        rss_bytes=_flat(300 * MiB, 3, grow_per_day=1500 * MiB),  # 2.5x the heap before it grows
        jvm_heap_after_gc_bytes=_flat(120 * MiB, 3, every=30),
    )
    result = analyze_instance(s, PARAMS)
    leak = next(f for f in result.findings if f.kind == "leak")
    assert leak.verdict == "leak" and leak.evidence["outside_java_heap"]
    assert "fragmentation" not in kinds(result.findings)
    frag = next(o for o in evaluate(s, T0 + 3 * DAY, PARAMS) if o.kind == "fragmentation")
    assert frag.state == "clear" and "the leak's growth" in frag.summary


def test_a_heap_that_grows_a_little_under_a_native_leak_does_not_hide_it_outside_the_heap():
    """Objects that own native memory are small on the heap: the heap after GC grows steadily too, but
    RSS grows twenty times faster; the leak reported is the RSS growth, outside the Java heap."""
    s = _instance(
        days=3,
        rss_bytes=_flat(300 * MiB, 3, grow_per_day=1500 * MiB),
        jvm_heap_after_gc_bytes=_flat(120 * MiB, 3, every=30, grow_per_day=75 * MiB),
    )
    leak = next(f for f in analyze_instance(s, PARAMS).findings if f.kind == "leak")
    assert leak.evidence["series"] == "rss_bytes" and leak.evidence["outside_java_heap"], leak.summary
    assert "outside the Java heap" in leak.summary


def test_a_heap_growing_in_collection_sized_jumps_is_not_outgrown_by_its_own_smooth_rss():
    """The heap after GC of a HashMap leak rises in jumps, one per old-generation collection, while
    RSS grows smoothly as the pages are touched: the same growth, in the heap, not outside it."""
    every = 1800  # an old-generation collection every 30 min finds 25 MiB more live
    heap = [(t, v + 1200 * MiB * every / DAY * ((t - T0) // every)) for t, v in _flat(120 * MiB, 3, every=30)]
    s = _instance(
        days=3, rss_bytes=_flat(300 * MiB, 3, grow_per_day=1200 * MiB), jvm_heap_after_gc_bytes=heap
    )
    leak = next(f for f in analyze_instance(s, PARAMS).findings if f.kind == "leak")
    assert leak.verdict == "leak" and not leak.evidence["outside_java_heap"], leak.summary
    assert "outside the Java heap" not in leak.summary


def test_fragmentation_there_before_a_leak_is_reported_beside_it_with_the_dominant_one():
    """Resident far above live from the start, and then the live bytes leak: both explanations hold, and
    each finding says which holds more memory and by how much."""
    s = _instance(
        days=3,
        rss_bytes=_flat(2000 * MiB, 3, grow_per_day=300 * MiB),
        allocator_allocated_bytes=_flat(300 * MiB, 3, grow_per_day=300 * MiB),
        allocator_resident_bytes=_flat(1900 * MiB, 3, grow_per_day=300 * MiB),
    )
    result = analyze_instance(s, PARAMS)
    found = {f.kind: f for f in result.findings}
    assert found["leak"].verdict == "leak" and found["fragmentation"].verdict == "fragmentation"
    both = found["fragmentation"].evidence["both"]
    assert both["dominant"] == "fragmentation" and both["factor"] > 5
    assert "fragmentation dominates" in found["fragmentation"].summary
    observations = {o.kind: o for o in evaluate(s, T0 + 3 * DAY, PARAMS)}
    if observations["leak"].state == "firing" and observations["fragmentation"].state == "firing":
        assert observations["leak"].evidence["both"]["dominant"] == "fragmentation"
