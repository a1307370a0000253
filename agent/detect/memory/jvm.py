"""A JVM's memory read as a JVM: the layer a growth is in, and the ceiling that layer hits first.

| layer | series (what grows) | ceiling | what ends it |
|---|---|---|---|
| `jvm_heap` | heap after GC (the post-GC floor) | 90 % of `-Xmx` (`jvm_heap_max_bytes`) | `java.lang.OutOfMemoryError: Java heap space` |
| `jvm_native` | RSS less the heap's resident part | the memory limit less `-Xmx` (the heap may still grow to it) | the container's OOM kill |
| `jvm_direct` | NMT "Other" (direct buffers) | `MaxDirectMemorySize`, else as much as the heap | `OutOfMemoryError: Direct buffer memory` |
| `jvm_metaspace` | metaspace used | `MaxMetaspaceSize`, when set | `OutOfMemoryError: Metaspace` |

A JVM throws `OutOfMemoryError` before its live heap fills `-Xmx`: with the floor near the ceiling
every allocation runs a full collection that frees little (the GC overhead limit), and the young
generation needs room of its own. The heap is therefore projected to `HEAP_USABLE` of `-Xmx`, a
conservative deadline. When `-Xmx` does not fit under the memory limit, the kill comes first: the
native layer then projects RSS to the limit, as for any process.

The native layer is RSS less the heap's resident pages, which the `jvm` probe reads from smaps (the
mappings of the heap's address range): committed heap is not all resident, and a heap that expands
towards `-Xmx` (a wider GC sawtooth over a flat floor) grows RSS through pages of its own, which is
the JVM sizing its heap, not a leak outside it.

The layers apply when that split is known; a recording with the heap after GC alone (or a ZGC heap,
which names no address range) is judged on the heap after GC and then on RSS.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

from agent.detect.model import JVM_HEAP_AFTER_GC, InstanceSeries

HEAP_COMMITTED = "jvm_heap_committed_bytes"
NATIVE = "jvm_native_bytes"  # RSS less the heap's resident pages (the `jvm` probe, from smaps)
DIRECT = "jvm_direct_bytes"
METASPACE = "jvm_metaspace_used_bytes"
HEAP_MAX, DIRECT_MAX, METASPACE_MAX = "jvm_heap_max_bytes", "jvm_direct_max_bytes", "jvm_metaspace_max_bytes"
CEILING_METRICS = (HEAP_MAX, DIRECT_MAX, METASPACE_MAX)
INPUT_METRICS = (HEAP_COMMITTED, NATIVE, DIRECT, METASPACE, *CEILING_METRICS)
HEAP_USABLE = 0.9  # a leaking JVM throws OutOfMemoryError before its floor fills -Xmx: projected to 90 %


@dataclass(frozen=True, slots=True)
class Layer:
    name: str
    title: str  # "in the Java heap"
    series_title: str  # "heap after GC"
    ceiling: str  # the ceiling's metric
    flag: str  # how people set it
    ends: str  # what reaching it does


LAYERS = {
    JVM_HEAP_AFTER_GC: Layer(
        "jvm_heap",
        "in the Java heap",
        "heap after GC",
        HEAP_MAX,
        "-Xmx",
        "java.lang.OutOfMemoryError: Java heap space",
    ),
    NATIVE: Layer("jvm_native", "outside the Java heap", "native memory", "", "memory limit", "an OOM kill"),
    DIRECT: Layer(
        "jvm_direct",
        "in direct buffers",
        "direct buffers",
        DIRECT_MAX,
        "-XX:MaxDirectMemorySize",
        "java.lang.OutOfMemoryError: Direct buffer memory",
    ),
    METASPACE: Layer(
        "jvm_metaspace",
        "in metaspace",
        "metaspace",
        METASPACE_MAX,
        "-XX:MaxMetaspaceSize",
        "java.lang.OutOfMemoryError: Metaspace",
    ),
}


def value_at(series: InstanceSeries, metric: str, start: float, tick: float) -> float | None:
    """The last value of `metric` before `tick` and not before `start` (a ceiling is its process's)."""
    points = series.series.get(metric)
    if not points:
        return None
    i = bisect_right(points, (tick, float("-inf"))) - 1
    return points[i][1] if i >= 0 and points[i][0] >= start and points[i][1] > 0 else None
