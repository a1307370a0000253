"""The `jvm` probe: heap figures, Native Memory Tracking and class histograms of JVM targets, via `jcmd`.

One `jcmd PID -f FILE` run per collection asks for `GC.heap_info` (every `heap_interval`),
`VM.native_memory summary` (answered only when the JVM runs with `-XX:NativeMemoryTracking`) and,
every `interval` (default 15 min), `GC.class_histogram -all`. The live variant (no `-all`) forces a
full GC, a latency blip on a serving JVM: it is used only with `histograms.jvm.live: true`, and then
at most every `live_floor`. jcmd is itself a JVM (about 0.2 s of CPU per run), hence the slow schedule.

The heap's resident pages come from smaps (the mappings of its address range), so that the JVM's
memory outside its heap is known (`jvm_native_bytes`). When a leak finding opens, the probe also
records what holds it (probes/jvmretainers.py).

jcmd is never run against a process that is not a JVM or a JVM that refuses attach (the probe reports
`ProbeUnavailable` instead), and only a trusted jcmd, as the JVM's user (probes/jcmd.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, TypeVar

from agent.core.errors import ProbeError, TargetGone
from agent.core.histograms import HistogramRow, Snapshot
from agent.core.records import ProbeResult, ProbeTarget, Sample
from probes.base import Schedule
from probes.jcmd import attach_refusal, is_jvm, run_jcmd
from probes.jvmretainers import Retainers
from probes.jvmtext import (
    ClassHistogram,
    HeapInfo,
    JcmdOutputError,
    NativeMemory,
    parse_class_histogram,
    parse_heap_info,
    parse_native_memory,
    split_report,
)
from probes.linux.maps import resident_within
from probes.linux.procfs import HOST_ROOT
from probes.settings import JvmHistograms, settings_for

DIRECT_CATEGORY = "Other"  # NMT's category of Unsafe.allocateMemory: direct ByteBuffers


@dataclass
class _Due:
    next_heap: float = 0.0
    next_histogram: float = 0.0
    last_live: float = float("-inf")
    checked: bool = False  # the process was found to be a JVM that accepts attach
    jvm: bool | None = None  # None: not looked yet


class JvmProbe:
    name: ClassVar[str] = "jvm"
    schedule: ClassVar[Schedule] = "slow"

    def __init__(self, root: Path = HOST_ROOT) -> None:
        self.root = root
        self._due: dict[tuple[str, int, float], _Due] = {}
        self._lock = threading.Lock()
        self.retainers = Retainers(root)

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        settings = settings_for(target, "jvm", JvmHistograms)
        key = (target.instance, target.pid, target.start_time)
        with self._lock:
            due = self._due.setdefault(key, _Due())
        want_heap = now >= due.next_heap
        want_histogram = now >= due.next_histogram
        if not (want_heap or want_histogram):
            return ProbeResult()
        if due.jvm is None:
            due.jvm = is_jvm(target.pid, self.root)
        if not due.jvm:
            return ProbeResult()  # not a JVM: nothing to say (other probes cover it)
        if not due.checked:
            refusal = attach_refusal(target.pid, self.root)
            if refusal is not None:
                raise refusal
            due.checked = True
        live = want_histogram and settings.live and now - due.last_live >= settings.live_floor
        commands = ["GC.heap_info", "VM.native_memory summary"]
        if want_histogram:
            commands.append("GC.class_histogram" if live else "GC.class_histogram -all")
            due.next_histogram = now + settings.interval  # a failed run waits its interval too
        due.next_heap = now + settings.heap_interval
        report = split_report(run_jcmd(target.pid, commands, settings, self.root))
        result = ProbeResult()
        heap = _parse(result, parse_heap_info, report.heap_info, "GC.heap_info")
        if heap is not None:
            _heap_samples(result, target.instance, now, heap)
            _resident_samples(result, target, now, heap, self.root)
        nmt = _parse(result, parse_native_memory, report.native_memory, "VM.native_memory summary")
        if nmt is not None:
            _nmt_samples(result, target, now, nmt)
        if want_histogram:
            histogram = _parse(result, parse_class_histogram, report.class_histogram, "GC.class_histogram")
            if histogram is not None:
                if live:
                    due.last_live = now
                _histogram_samples(result, target, now, histogram, live, heap)
        self.retainers.step(target, now, settings, result)
        return result

    def want_sites(self, instance: str) -> None:
        """A leak finding opened on `instance`: record what holds it (when it is a JVM heap's)."""
        self.retainers.want(instance)

    def forget(self, target: ProbeTarget) -> None:
        key = (target.instance, target.pid, target.start_time)
        with self._lock:
            self._due.pop(key, None)
        self.retainers.forget(key)


Parsed = TypeVar("Parsed")  # what one section's parser makes of it


def _parse(result: ProbeResult, parse: Callable[[str], Parsed], text: str | None, what: str) -> Parsed | None:
    """A parsed section, or None with the problem recorded (a missing or odd section is a partial failure)."""
    if text is None:
        result.problems.append(JcmdOutputError(f"{what}: jcmd's answer has no such section"))
        return None
    try:
        return parse(text)
    except JcmdOutputError as exc:
        result.problems.append(exc)
        return None


def _heap_samples(result: ProbeResult, instance: str, now: float, heap: HeapInfo) -> None:
    figures = {
        "jvm_heap_used_bytes": heap.used,
        "jvm_heap_committed_bytes": heap.committed,
        "jvm_heap_after_gc_bytes": heap.after_gc,
        "jvm_metaspace_used_bytes": heap.metaspace_used,
    }
    result.samples.extend(Sample(instance, m, now, float(v)) for m, v in figures.items() if v is not None)


def _resident_samples(
    result: ProbeResult, target: ProbeTarget, now: float, heap: HeapInfo, root: Path
) -> None:
    """The heap's resident pages (the mappings of its address range in smaps) and the rest of the RSS:
    the JVM's memory outside the heap. Committed heap is not all resident, and a heap that widens its
    GC sawtooth touches more of it: RSS grows, and only this split tells that from native growth."""
    if heap.span is None:
        return  # ZGC prints no range (and maps its heap several times over)
    try:
        inside, total = resident_within(target.pid, *heap.span, root)
    except TargetGone:
        raise
    except ProbeError as exc:
        result.problems.append(exc)
        return
    result.samples.append(Sample(target.instance, "jvm_heap_resident_bytes", now, float(inside)))
    result.samples.append(Sample(target.instance, "jvm_native_bytes", now, float(total - inside)))


def _nmt_samples(result: ProbeResult, target: ProbeTarget, now: float, nmt: NativeMemory) -> None:
    figures = {
        "jvm_nmt_committed_bytes": nmt.committed,
        "jvm_nmt_malloc_bytes": nmt.malloc,
        "jvm_nmt_heap_committed_bytes": nmt.heap_committed,
        "jvm_direct_bytes": nmt.categories.get(DIRECT_CATEGORY, (0, None))[1],
    }
    result.samples.extend(
        Sample(target.instance, m, now, float(v)) for m, v in figures.items() if v is not None
    )
    rows = [HistogramRow(name, 0.0, float(c)) for name, (_r, c) in nmt.categories.items()]
    snapshot = Snapshot(
        target.instance,
        "nmt",
        now,
        rows,
        0.0,
        float(nmt.committed),
        target.pid,
        target.start_time,
        len(rows),
        {"reserved_bytes": nmt.reserved, "malloc_bytes": nmt.malloc},
    )
    result.snapshots.append(snapshot)


def _histogram_samples(
    result: ProbeResult,
    target: ProbeTarget,
    now: float,
    histo: ClassHistogram,
    live: bool,
    heap: HeapInfo | None,
) -> None:
    result.samples.append(Sample(target.instance, "jvm_histogram_bytes", now, float(histo.total_bytes)))
    result.samples.append(
        Sample(target.instance, "jvm_histogram_instances", now, float(histo.total_instances))
    )
    rows = [HistogramRow(r.name, float(r.instances), float(r.bytes), r.module) for r in histo.rows]
    meta = {"variant": "live" if live else "all", "bad_rows": histo.bad_rows}
    if heap is not None:
        meta["collector"] = heap.collector
    snapshot = Snapshot(
        target.instance,
        "jvm",
        now,
        rows,
        float(histo.total_instances),
        float(histo.total_bytes),
        target.pid,
        target.start_time,
        len(rows),
        meta,
    )
    result.snapshots.append(snapshot)
