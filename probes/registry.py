"""The table of probes: name → (module, class, default on/off). Imported lazily, enabled by config."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from probes.base import Probe


@dataclass(frozen=True, slots=True)
class ProbeEntry:
    module: str
    cls: str
    default_enabled: bool
    doc: str


PROBES: dict[str, ProbeEntry] = {
    "process": ProbeEntry(
        "probes.process", "ProcessProbe", True, "RSS, CPU, threads, fds, faults from /proc"
    ),
    "smaps": ProbeEntry("probes.smaps", "SmapsProbe", True, "PSS/USS from smaps_rollup, slow schedule"),
    "cgroup": ProbeEntry("probes.cgroup", "CgroupProbe", True, "cgroup v1/v2 memory, CPU throttling, PSI"),
    "allocator": ProbeEntry("probes.allocator", "AllocatorProbe", True, "allocator figures via the hook"),
    "latency": ProbeEntry("probes.latency", "LatencyProbe", True, "quantiles from the instance's /metrics"),
    "canary": ProbeEntry("probes.canary", "CanaryProbe", True, "an active request on a schedule, timed"),
    "jvm": ProbeEntry("probes.jvm", "JvmProbe", True, "JVM heap, NMT and class histograms via jcmd, slow"),
    "jvm_limits": ProbeEntry(
        "probes.jvmlimits", "JvmLimitsProbe", True, "a JVM's own ceilings (-Xmx, direct, metaspace), slow"
    ),
    "pyhist": ProbeEntry(
        "probes.pyhist", "PythonHistogramProbe", True, "Python type histograms and allocation sites (hook)"
    ),
    "heapprof": ProbeEntry("probes.heapprof", "HeapProfileProbe", True, "jemalloc/gperftools heap profiles"),
}


def create_probe(name: str) -> Probe:
    """Instantiate the probe registered under `name`; KeyError lists the known ones."""
    try:
        entry = PROBES[name]
    except KeyError:
        raise KeyError(f"unknown probe {name!r}; known probes: {', '.join(sorted(PROBES))}") from None
    module = importlib.import_module(entry.module)
    factory: Callable[[], Probe] = getattr(module, entry.cls)  # a class of the table: a Probe
    return factory()
