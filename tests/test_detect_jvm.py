"""A JVM's memory read as a JVM (agent/detect/memory/jvm.py), on synthetic series of the shapes the `jvm` and
`jvm_limits` probes record: each growth projected to the ceiling of the layer it grows in, and a heap
that expands towards -Xmx over a flat floor read as the JVM sizing its heap, not as a leak."""

from __future__ import annotations

import random

from agent.detect import InstanceSeries, analyze_instance
from support.detect_shapes import DAY, PARAMS, T0, kinds

MiB = 2**20
SAW = 7.0  # seconds between young collections


def jvm(
    *,
    days: float = 3.0,
    floor: float = 100 * MiB,
    floor_per_day: float = 0.0,
    amplitude: float = 40 * MiB,
    amplitude_per_day: float = 0.0,
    native: float = 120 * MiB,
    native_per_day: float = 0.0,
    direct_per_day: float | None = None,
    xmx: float | None = 384 * MiB,
    max_direct: float | None = None,
    limit: float = 640 * MiB,
    every: int = 5,
    seed: int = 1,
) -> InstanceSeries:
    """RSS every second; heap figures (its resident pages as smaps tells them), NMT's direct buffers and
    the ceilings every `every` seconds. The heap commits as its sawtooth widens (up to -Xmx) and RSS
    holds the pages the heap has touched."""
    rng = random.Random(seed)
    rss, used, after, committed, outside_heap, direct, ceilings = [], [], [], [], [], [], {}
    touched = held = 0.0
    for i in range(int(days * DAY)):
        ts, day = float(T0 + i), i / DAY
        live = floor + floor_per_day * day
        swing = amplitude + amplitude_per_day * min(day, 1.0)  # widens for a day, then stays
        heap_used = live + swing * ((i % SAW) / SAW)
        cap = xmx or 4096 * MiB
        held = min(cap, max(held, (live + swing) * 1.15))
        touched = min(held, max(touched, heap_used))
        outside = native + native_per_day * day + (direct_per_day or 0.0) * day
        rss.append((ts, outside + touched + rng.gauss(0, 0.3 * MiB)))
        if i % every == 0:
            outside_heap.append((ts, rss[-1][1] - touched))
            used.append((ts, heap_used))
            after.append((ts, live + rng.gauss(0, 0.2 * MiB)))
            committed.append((ts, held))
            if direct_per_day is not None:
                direct.append((ts, 4 * MiB + direct_per_day * day))
    series = {
        "rss_bytes": rss,
        "jvm_heap_used_bytes": used,
        "jvm_heap_after_gc_bytes": after,
        "jvm_heap_committed_bytes": committed,
        "jvm_native_bytes": outside_heap,
    }
    if direct:
        series["jvm_direct_bytes"] = direct
    if xmx is not None:
        ceilings["jvm_heap_max_bytes"] = xmx
        ceilings["jvm_direct_max_bytes"] = max_direct or xmx
    for name, value in ceilings.items():
        series[name] = [(float(T0 + i), value) for i in range(0, int(days * DAY), 60)]
    return InstanceSeries("jvm", series, restarts=[], memory_limit=limit)


def test_a_heap_leak_is_projected_to_xmx_and_names_the_java_heap_ceiling():
    """Xmx 384 MiB in a 640 MiB container: the floor reaches 90 % of -Xmx long before RSS nears the
    container's limit; the finding opens before the JVM would throw OutOfMemoryError, and says so."""
    s = jvm(floor_per_day=120 * MiB)
    result = analyze_instance(s, PARAMS)
    leak = next(f for f in result.findings if f.kind == "leak")
    opened = result.at_open[leak.id]
    floor_at_open = 100 * MiB + 120 * MiB * (opened.opened_at - T0) / DAY
    assert floor_at_open < 384 * MiB * 0.9  # found while the JVM still runs
    evidence = opened.evidence
    assert evidence["series"] == "jvm_heap_after_gc_bytes" and evidence["layer"] == "jvm_heap"
    assert evidence["ceiling_bytes"] == 384 * MiB and evidence["limit_bytes"] == 0.9 * 384 * MiB
    assert not evidence["outside_java_heap"]
    expected = (0.9 * 384 * MiB - floor_at_open) / (120 * MiB / DAY)
    assert 0.6 * expected < evidence["time_to_oom_seconds"] < 1.4 * expected
    assert "java.lang.OutOfMemoryError: Java heap space in " in opened.summary
    assert "heap after GC grows" in opened.summary and "towards -Xmx 384.0 MiB" in opened.summary
    oom = next(f for f in result.findings if f.kind == "oom-risk")  # the safety net projects the same
    assert result.at_open[oom.id].evidence["layer"] == "jvm_heap"


def test_a_heap_expanding_towards_xmx_over_a_flat_floor_is_no_finding():
    """The GC sawtooth widens from 40 MiB to 240 MiB and the JVM commits heap for it (up to -Xmx): RSS
    grows by 200 MiB through the heap's own pages. Not a leak outside the heap, not an OOM risk, not
    heap the JVM keeps."""
    s = jvm(amplitude_per_day=200 * MiB, days=3.0)
    rss = s.series["rss_bytes"]
    assert rss[-1][1] - rss[0][1] > 180 * MiB  # RSS really grew
    result = analyze_instance(s, PARAMS)
    assert result.findings == [], [(f.kind, f.summary) for f in result.findings]


def test_native_growth_projects_to_the_limit_less_xmx_and_is_outside_the_heap():
    s = jvm(native_per_day=150 * MiB)
    result = analyze_instance(s, PARAMS)
    leak = next(f for f in result.findings if f.kind == "leak")
    opened = result.at_open[leak.id]
    assert opened.evidence["layer"] == "jvm_native" and opened.evidence["outside_java_heap"]
    assert opened.evidence["limit_bytes"] == 640 * MiB - 384 * MiB
    assert "outside the Java heap" in opened.summary and "less -Xmx 384.0 MiB" in opened.summary
    assert "fragmentation" not in kinds(result.findings)


def test_a_direct_buffer_leak_is_projected_to_its_own_ceiling_and_is_never_retention():
    """Direct buffers grow towards -XX:MaxDirectMemorySize=32m: that deadline comes long before the
    container's, and the JVM's RSS far above its heap is never read as memory the allocator keeps."""
    s = jvm(direct_per_day=30 * MiB, max_direct=32 * MiB, native=200 * MiB)
    result = analyze_instance(s, PARAMS)
    assert "fragmentation" not in kinds(result.findings)
    leak = next(f for f in result.findings if f.kind == "leak")
    opened = result.at_open[leak.id]
    assert opened.evidence["layer"] == "jvm_direct" and opened.evidence["ceiling_bytes"] == 32 * MiB
    assert "java.lang.OutOfMemoryError: Direct buffer memory in " in opened.summary


def test_without_the_heap_ceiling_heap_growth_is_projected_to_the_container_and_says_so():
    s = jvm(floor_per_day=120 * MiB, xmx=None, limit=600 * MiB)
    result = analyze_instance(s, PARAMS)
    leak = next(f for f in result.findings if f.kind == "leak")
    opened = result.at_open[leak.id]
    assert opened.evidence["limit_bytes"] == 600 * MiB and opened.evidence["layer"] is None
    assert "(the JVM's heap ceiling is unknown)" in opened.summary
