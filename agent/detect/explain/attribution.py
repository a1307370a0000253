"""Memory attribution: which layer of a process holds its RSS, and in which layer it grows.

Layers, each from the probes that see it, stacked without double counting:

- `file_mapped`: `rss_file_bytes + rss_shmem_bytes` (code, mapped model files, shared memory);
- `jvm_heap`: the resident part of the Java heap: its pages resident in smaps (`jvm_heap_resident_bytes`);
  without that figure, committed (NMT "Java Heap", else `GC.heap_info`),
  but no more than the most the heap has used in this lifetime (committed pages never touched are not
  resident, and would otherwise absorb growth that is elsewhere). Pages touched are the young
  generation's (every allocation burst fills it before a collection empties it: the widest span seen
  between a bucket's peak of heap used and the heap after GC) plus the old generation's high-water mark
  (the most the heap after GC has held), and at least the highest peak of heap used seen: so the layer
  grows as the live set does, not only when a sample happens to catch a full young generation;
- `jvm_native`: NMT committed minus the Java heap (threads, code cache, GC, metaspace…);
- `python_objects`: the type histogram's shallow bytes (inside malloc's live bytes when pymalloc is off);
- `allocator_live`: allocator live bytes minus NMT's malloc (and Python objects, pymalloc off);
- `allocator_free`: allocator resident minus live (fragmentation, retention, metadata);
- `unexplained`: RSS minus all of the above: anonymous memory no probe accounts for (JNI and native
  libraries without a hook, allocations NMT does not see, pymalloc arenas, stacks).

Values are lower envelopes on a common grid over the window (bucket minima, carried forward), so
a GC sawtooth does not read as growth. Each layer's bytes are stacked and clipped to the RSS, but its
slope and confidence (the leak detector's trend test) come from its own figure, unclipped: a layer that
does not grow cannot soak up growth elsewhere by being clipped less as RSS rises. `unexplained` grows
as RSS minus every other layer's own figure does. The growth layer is the one growing most, if it
explains at least half of the RSS growth (or RSS does not grow at all); its verdict names the next
step that is really available for this target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent.core.units import format_bytes
from agent.detect.explain.ranking import suspects_for
from agent.detect.explain.retainers import with_held_by
from agent.detect.explain.sustained import MIN_CONFIDENCE, growth
from agent.state.histograms import HistogramStore
from agent.state.series import Aggregate
from agent.state.store import Store

GRID_POINTS = 48
INPUTS = (
    "rss_bytes",
    "rss_file_bytes",
    "rss_shmem_bytes",
    "jvm_heap_committed_bytes",
    "jvm_heap_used_bytes",
    "jvm_heap_after_gc_bytes",
    "jvm_heap_resident_bytes",
    "jvm_nmt_committed_bytes",
    "jvm_nmt_heap_committed_bytes",
    "jvm_nmt_malloc_bytes",
    "python_gc_objects_bytes",
    "pymalloc_allocated_blocks",
    "allocator_allocated_bytes",
    "allocator_resident_bytes",
)
PEAKS = {"jvm_heap_used_peak": "jvm_heap_used_bytes"}  # grid inputs taken as bucket maxima
TITLES = {
    "file_mapped": "file-backed and shared memory (code, mapped files)",
    "jvm_heap": "Java heap (resident: committed and used)",
    "jvm_native": "JVM native memory tracked by NMT",
    "python_objects": "Python objects (gc-tracked, shallow)",
    "allocator_live": "live native allocations (malloc)",
    "allocator_free": "free memory the allocator holds (fragmentation, retention)",
    "unexplained": "unexplained anonymous memory",
}


@dataclass(frozen=True, slots=True)
class Layer:
    name: str
    bytes: float
    bytes_per_second: float
    confidence: float
    title: str
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "bytes": self.bytes,
            "bytes_per_second": self.bytes_per_second,
            "bytes_per_hour": self.bytes_per_second * 3600,
            "confidence": round(self.confidence, 6),
            "note": self.note,
        }


@dataclass(slots=True)
class Attribution:
    instance: str
    since: float
    until: float
    rss_bytes: float | None
    rss_bytes_per_second: float | None
    layers: list[Layer] = field(default_factory=list)
    growth_layer: str | None = None
    verdict: str = ""
    missing: list[str] = field(default_factory=list)  # what would let medic explain more

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "since": self.since,
            "until": self.until,
            "rss_bytes": self.rss_bytes,
            "rss_bytes_per_second": self.rss_bytes_per_second,
            "rss_bytes_per_hour": None
            if self.rss_bytes_per_second is None
            else self.rss_bytes_per_second * 3600,
            "layers": [layer.to_dict() for layer in self.layers],
            "growth_layer": self.growth_layer,
            "verdict": self.verdict,
            "missing": self.missing,
        }


def attribution_for(store: Store, instance: str, since: float, now: float) -> Attribution:
    """Split the RSS of `instance` into layers over [since, now] and say where it grows.

    The window is narrowed to the current process lifetime and to where RSS samples begin, so that a
    young process still gets a full grid and a restart's drop is not read as shrinking.
    """
    since = _lifetime_start(store, instance, since, now)
    step = max((now - since) / GRID_POINTS, 1.0)
    grid = {metric: _on_grid(store, instance, metric, since, now, step) for metric in INPUTS}
    for name, metric in PEAKS.items():
        grid[name] = _on_grid(store, instance, metric, since, now, step, agg="max")
    rss = grid["rss_bytes"]
    result = Attribution(instance, since, now, None, None)
    known = [i for i, v in enumerate(rss) if v is not None]
    if not known:
        result.verdict = "no RSS samples in this window yet"
        return result
    layers, figures = split(grid, known)
    xs = [since + (i + 0.5) * step for i in known]
    rss_values = [v for v in rss if v is not None]  # at the points `known`
    rss_growth = growth(xs, rss_values)
    result.rss_bytes = rss_values[-1]
    result.rss_bytes_per_second = rss_growth.slope
    for name, values in layers.items():
        fitted = growth(xs, figures[name])
        result.layers.append(Layer(name, values[-1], fitted.slope, fitted.confidence, TITLES[name]))
    result.missing = _missing(grid)
    sites = bool(HistogramStore(store).snapshots(instance, since, now, "site", None, 1))
    result.growth_layer, result.verdict = _verdict(result, rss_growth.confidence, grid, sites)
    return result


def explain(store: Store, instance: str, since: float, now: float, limit: int = 5) -> dict[str, Any]:
    """What a memory finding carries to name its culprit: the attribution, and the suspects ranked for
    where the growth is (outside the Java heap: the classes whose counts rise with the native bytes)."""
    attribution = attribution_for(store, instance, since, now)
    native = attribution.growth_layer in ("unexplained", "jvm_native") and _is_jvm(attribution)
    suspects = with_held_by(
        store, instance, since, now, suspects_for(store, instance, since, now, limit=limit, native=native)
    )
    return {"attribution": attribution.to_dict(), "suspects": [s.to_dict() for s in suspects]}


def _is_jvm(attribution: Attribution) -> bool:
    return any(layer.name in ("jvm_heap", "jvm_native") for layer in attribution.layers)


def _lifetime_start(store: Store, instance: str, since: float, now: float) -> float:
    started = store.latest(instance, "process_start_time_seconds")
    if started is not None and since < started[1] <= now:
        since = started[1]
    first = store.series(instance, "rss_bytes", since, now, max_points=1, now=now).points
    return max(since, first[0][0]) if first and first[0][0] < now else since


def split(
    grid: dict[str, list[float | None]], known: list[int]
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Each layer's values at the grid points `known` (where RSS is known), clipped to what remains, and
    each layer's own figure unclipped (for `unexplained`: RSS minus every other figure)."""
    layers: dict[str, list[float]] = {name: [] for name in TITLES}
    figures: dict[str, list[float]] = {name: [] for name in TITLES}
    present = {metric for metric, values in grid.items() if any(v is not None for v in values)}
    heap_touched = 0.0  # the most the heap used so far: pages once touched stay resident
    young_span = floor_high = 0.0  # the young generation's widest fill, the old one's high-water mark
    for i in known:
        value = {metric: values[i] for metric, values in grid.items()}
        rss = value["rss_bytes"] or 0.0
        left = rss

        def take(name: str, amount: float | None) -> None:
            nonlocal left
            figures[name].append(max(amount or 0.0, 0.0))
            part = min(max(amount or 0.0, 0.0), left)
            layers[name].append(part)
            left -= part

        take("file_mapped", (value["rss_file_bytes"] or 0.0) + (value["rss_shmem_bytes"] or 0.0))
        heap = value["jvm_nmt_heap_committed_bytes"] or value["jvm_heap_committed_bytes"]
        used = value.get("jvm_heap_used_peak") or value["jvm_heap_used_bytes"]
        if value["jvm_heap_resident_bytes"] is not None:
            heap = value["jvm_heap_resident_bytes"]  # read from smaps: no estimate needed
        elif heap is not None and used is not None:
            heap_touched = max(heap_touched, used)
            floor = value["jvm_heap_after_gc_bytes"]
            if floor is not None:
                young_span, floor_high = max(young_span, used - floor), max(floor_high, floor)
                heap_touched = max(heap_touched, floor_high + young_span)
            heap = min(heap, heap_touched)
        take("jvm_heap", heap)
        nmt_total, nmt_heap = value["jvm_nmt_committed_bytes"], value["jvm_nmt_heap_committed_bytes"]
        take("jvm_native", (nmt_total - (nmt_heap or 0.0)) if nmt_total is not None else None)
        python = value["python_gc_objects_bytes"]
        pymalloc_on = (value["pymalloc_allocated_blocks"] or 0.0) > 0
        take("python_objects", python)
        live, resident = value["allocator_allocated_bytes"], value["allocator_resident_bytes"]
        if live is not None:
            live -= value["jvm_nmt_malloc_bytes"] or 0.0
            if not pymalloc_on:
                live -= python or 0.0
        take("allocator_live", live)
        free = None
        if resident is not None and value["allocator_allocated_bytes"] is not None:
            free = resident - value["allocator_allocated_bytes"]
        take("allocator_free", free)
        layers["unexplained"].append(left)
        figures["unexplained"].append(
            rss - sum(figures[name][-1] for name in TITLES if name != "unexplained")
        )
    wanted = {"file_mapped", "unexplained"}
    if present & {"jvm_heap_committed_bytes", "jvm_nmt_heap_committed_bytes", "jvm_heap_resident_bytes"}:
        wanted.add("jvm_heap")
    if "jvm_nmt_committed_bytes" in present:
        wanted.add("jvm_native")
    if "python_gc_objects_bytes" in present:
        wanted.add("python_objects")
    if "allocator_allocated_bytes" in present:
        wanted.add("allocator_live")
    if "allocator_resident_bytes" in present:
        wanted.add("allocator_free")
    return (
        {name: values for name, values in layers.items() if name in wanted},
        {name: values for name, values in figures.items() if name in wanted},
    )


def _on_grid(
    store: Store, instance: str, metric: str, since: float, now: float, step: float, agg: Aggregate = "min"
) -> list[float | None]:
    """Bucket minima (or maxima) of one series on the grid, carried forward over empty buckets."""
    count = max(1, int((now - since) / step + 0.5))
    values: list[float | None] = [None] * count
    points = store.series(instance, metric, since, now, step=step, agg=agg, max_points=count, now=now).points
    pick = min if agg == "min" else max
    for ts, value in points:
        i = min(count - 1, max(0, int((ts - since) / step)))
        current = values[i]
        values[i] = value if current is None else pick(current, value)
    last: float | None = None
    for i, found in enumerate(values):
        if found is None:
            values[i] = last
        else:
            last = found
    return values


def _missing(grid: dict[str, list[float | None]]) -> list[str]:
    have = {metric for metric, values in grid.items() if any(v is not None for v in values)}
    missing = []
    if "allocator_allocated_bytes" not in have:
        missing.append("allocator figures: add the allocator hook (medic doctor NAME says how)")
    jvm = have & {"jvm_heap_committed_bytes", "jvm_nmt_committed_bytes"}
    if jvm and "jvm_nmt_committed_bytes" not in have:
        missing.append("JVM native memory: start the JVM with -XX:NativeMemoryTracking=summary")
    return missing


def _verdict(
    result: Attribution, rss_confidence: float, grid: dict[str, list[float | None]], sites: bool
) -> tuple[str | None, str]:
    growing = [
        layer for layer in result.layers if layer.bytes_per_second > 0 and layer.confidence >= MIN_CONFIDENCE
    ]
    rss_slope = result.rss_bytes_per_second or 0.0
    if not growing:
        if rss_slope > 0 and rss_confidence >= MIN_CONFIDENCE:
            return None, "RSS grows, but no single layer grows steadily enough to name"
        return None, "no layer grows steadily in this window"
    top = max(growing, key=lambda layer: layer.bytes_per_second)
    fastest = max(result.layers, key=lambda layer: layer.bytes_per_second)
    if fastest is not top and fastest.bytes_per_second > top.bytes_per_second:
        # the text must agree with the table beside it: a layer that grows faster, in jumps, is
        # not outweighed by a slower one that grows steadily
        return None, (
            f"{fastest.title} grows fastest ({format_bytes(fastest.bytes_per_second * 3600)}/h) but not "
            f"steadily enough to name; {top.title} grows steadily at {format_bytes(top.bytes_per_second * 3600)}/h"
        )
    rss_grows = rss_slope > 0 and rss_confidence >= MIN_CONFIDENCE
    if rss_grows and top.bytes_per_second < 0.5 * rss_slope:
        return None, "RSS grows across several layers; none explains half of it"
    return top.name, _explain(top.name, grid, result.instance, sites)


def _explain(layer: str, grid: dict[str, list[float | None]], instance: str, sites: bool) -> str:
    has = {metric for metric, values in grid.items() if any(v is not None for v in values)}
    jvm = bool(has & {"jvm_heap_committed_bytes", "jvm_nmt_committed_bytes"})
    nmt = "jvm_nmt_committed_bytes" in has
    python = bool(has & {"python_gc_objects_bytes", "pymalloc_allocated_blocks"})
    site_step = (
        "see the allocation-site suspects"
        if sites
        else f"enable allocation sites: medic heap {instance} --sites 15m"
        if python
        else "heap profiles name the allocation sites (histograms.heap_profiles with jemalloc or "
        f"tcmalloc; medic heap {instance})"
    )
    if layer == "unexplained":
        if jvm and nmt:
            return (
                "growth is outside the Java heap and invisible to NMT: native memory of JNI, native "
                "libraries or JDK objects that own native memory (zip streams, direct buffers): see the "
                "class suspects whose counts rise with it"
            )
        if jvm:
            return (
                "growth is outside the Java heap: native memory (start the JVM with "
                "-XX:NativeMemoryTracking=summary to tell JVM internals from JNI and native libraries)"
            )
        if python:
            return f"growth is in memory outside Python's tracked objects and malloc's figures: {site_step}"
        if "allocator_allocated_bytes" in has:
            return "growth is in anonymous memory the allocator does not see (mmap, pymalloc arenas, stacks)"
        return "growth is in anonymous memory no probe accounts for: add the allocator hook to see malloc"
    return {
        "file_mapped": "growth is in file-backed or shared memory (mapped files, shared memory segments)",
        "jvm_heap": "growth is in the Java heap: see the class suspects",
        "jvm_native": "growth is in JVM native memory that NMT tracks: see the NMT categories",
        "python_objects": "growth is in Python objects: see the type suspects",
        "allocator_live": f"growth is in live native allocations: {site_step}",
        "allocator_free": (
            "growth is free memory the allocator keeps (fragmentation or retention), not live data: "
            "a purge may return it"
        ),
    }[layer]
