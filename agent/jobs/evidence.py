"""What the agent captures before a restart destroys it: the evidence captures the engine runs
(`EngineHooks.captures`, each `(view, timeout) -> value`, bounded by `remediation.evidence`).

    heap_profile   a fresh heap-profile dump of the process (through its hook, else the newest dump its
                   allocator wrote itself), for instances with `histograms.heap_profiles`; stored as the
                   raw dump and its symbolized allocation sites, largest first
    histogram      the last JVM class / Python type histogram and allocation sites the store holds
    smaps_rollup   /proc/PID/smaps_rollup
    series         the last hour of the memory series the detectors judged

A capture with nothing to give returns None (recorded as "nothing to capture"); one that fails
raises, and the engine records the error. None of them holds the restart back.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from agent.core.errors import ProbeError
from agent.core.records import ProbeTarget
from agent.state.histograms import HistogramStore
from agent.state.store import Store
from probes.heapprof import HeapProfileProbe
from probes.linux.procfs import HOST_ROOT, proc_path, read_file
from probes.settings import opted_in
from remediation.evidence import CaptureFn, Parts
from remediation.model import InstanceView

SERIES = ("rss_bytes", "allocator_allocated_bytes", "allocator_resident_bytes", "jvm_heap_after_gc_bytes")
HISTOGRAM_SOURCES = ("jvm", "python", "tracemalloc", "nmt")
TOP_ROWS = 50
HISTOGRAM_AGE = 6 * 3600.0  # an older histogram says little about the process being restarted
MAX_DUMP_BYTES = 64 * 2**20

Target = Callable[[InstanceView], ProbeTarget | None]


def captures(store: Store, target: Target) -> dict[str, CaptureFn]:
    """The captures for the engine; `target(view)` is the probe target of the instance's process now."""
    histograms = HistogramStore(store)

    def heap_profile(view: InstanceView, timeout: float) -> Parts | None:
        found = target(view)
        if found is None or not opted_in(found, "heap_profiles"):
            return None
        result = HeapProfileProbe().collect(found, time.time())
        if not result.snapshots:
            return None
        snapshot = result.snapshots[0]
        dump = str(snapshot.meta.get("file") or "")
        parts = Parts(sites=snapshot.to_dict(top=TOP_ROWS))
        if dump:
            parts["heap"] = _take_dump(dump)
        return parts

    def histogram(view: InstanceView, timeout: float) -> dict[str, Any] | None:
        now = time.time()
        found: dict[str, Any] = {}
        for source in HISTOGRAM_SOURCES:
            latest = histograms.snapshots(view.name, now - HISTOGRAM_AGE, now, source=source, limit=1)
            if latest and latest[-1].id is not None:
                full = histograms.load(latest[-1].id)
                if full is not None:
                    found[source] = full.to_dict(top=TOP_ROWS)
        return found or None

    def smaps_rollup(view: InstanceView, timeout: float) -> str | None:
        if view.pid is None:
            return None
        try:
            return read_file(proc_path(HOST_ROOT, view.pid, "smaps_rollup"), view.pid).decode(
                "ascii", "replace"
            )
        except ProbeError:
            return None

    def series(view: InstanceView, timeout: float) -> dict[str, Any] | None:
        """The last hour of the memory series: what the detectors saw before the restart."""
        now = time.time()
        stored = set(store.metrics(view.name))
        found = {
            metric: store.series(view.name, metric, now - 3600, now, step=10).points
            for metric in SERIES
            if metric in stored
        }
        return found or None

    return {
        "heap_profile": heap_profile,
        "histogram": histogram,
        "smaps_rollup": smaps_rollup,
        "series": series,
    }


def _take_dump(path: str) -> bytes:
    """The dump medic had written for the evidence (read, bounded, then removed from the target's
    directory: the probe's own dumps keep their `keep`)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        data = os.read(fd, MAX_DUMP_BYTES)
    finally:
        os.close(fd)
    if os.path.basename(path).startswith("medic."):
        try:
            os.unlink(path)
        except OSError:
            pass
    return data
