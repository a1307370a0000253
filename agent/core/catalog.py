"""The metric catalog: every per-instance metric medic stores, with its Prometheus name, type and help.

Probes emit samples under these names; the store keeps them; `/metrics` exports them as
`medic_<name>` with the label `name` (the instance). The label is not `instance` because
Prometheus attaches its own `instance` label to every scrape. Two kinds of stored metric are
exported otherwise: the interval quantiles of the latency probe share one summary family with a
`quantile` label (`medic_latency_seconds{quantile="0.99"}`; quantiles only, no `_count`/`_sum`),
and the per-interval rates are not exported at all (PromQL derives them from the counters,
`rate(medic_requests_total[5m])`). Dashboards, alert rules and docs/metrics.md are checked
against this table by the tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    kind: Literal["gauge", "counter"]
    help: str
    source: str  # the probe (or "agent") that produces it
    # the exported family when it is not `medic_<name>`; "" when the metric is not exported
    family: str | None = None
    quantile: str | None = None  # the `quantile` label of a shared quantile family


@dataclass(frozen=True, slots=True)
class ExportedFamily:
    """One family of `/metrics` made from stored metrics: its name, type, help and extra label."""

    name: str
    kind: Literal["gauge", "counter", "summary"]
    help: str
    extra_label: str | None = None


LATENCY_FAMILY = "medic_latency_seconds"
_NOT_EXPORTED = ""  # a rate over the last interval: stored for the detectors and the API only


_SPECS = [
    # process probe: /proc/PID/{stat,statm,status,fd}, every tick
    MetricSpec("rss_bytes", "gauge", "Resident set size of the instance's process.", "process"),
    MetricSpec("rss_anon_bytes", "gauge", "Anonymous resident memory (heap, stacks).", "process"),
    MetricSpec("rss_file_bytes", "gauge", "File-backed resident memory (code, mapped files).", "process"),
    MetricSpec("rss_shmem_bytes", "gauge", "Shared-memory resident memory.", "process"),
    MetricSpec(
        "rss_peak_bytes", "gauge", "Peak resident set size since the process started (VmHWM).", "process"
    ),
    MetricSpec("vms_bytes", "gauge", "Virtual memory size.", "process"),
    MetricSpec("swap_bytes", "gauge", "Swapped-out anonymous memory.", "process"),
    MetricSpec("cpu_seconds_total", "counter", "User plus system CPU time consumed.", "process"),
    MetricSpec("threads", "gauge", "Number of threads.", "process"),
    MetricSpec("open_fds", "gauge", "Number of open file descriptors.", "process"),
    MetricSpec("minor_faults_total", "counter", "Minor page faults.", "process"),
    MetricSpec("major_faults_total", "counter", "Major page faults (read from disk).", "process"),
    MetricSpec("ctx_switches_voluntary_total", "counter", "Voluntary context switches.", "process"),
    MetricSpec("ctx_switches_involuntary_total", "counter", "Involuntary context switches.", "process"),
    # smaps probe: /proc/PID/smaps_rollup, on the slow schedule (it walks page tables)
    MetricSpec("pss_bytes", "gauge", "Proportional set size (shared pages divided among sharers).", "smaps"),
    MetricSpec("uss_bytes", "gauge", "Unique set size (private pages): what a restart would free.", "smaps"),
    MetricSpec("swap_pss_bytes", "gauge", "Proportional swap usage.", "smaps"),
    # the instance's process tree (its process and the workers below it): agent/watch/tree.py
    MetricSpec(
        "tree_processes", "gauge", "Processes of the instance: its own and the workers below it.", "process"
    ),
    MetricSpec(
        "tree_rss_bytes",
        "gauge",
        "RSS of the instance's processes summed (a page they share counts in each).",
        "process",
    ),
    MetricSpec(
        "tree_pss_bytes",
        "gauge",
        "PSS of the instance's processes summed (shared pages counted once).",
        "smaps",
    ),
    MetricSpec(
        "tree_memory_bytes",
        "gauge",
        "Memory of the instance as judged: its cgroup's working set when it owns the cgroup, else "
        "its processes' RSS less the pages they share.",
        "process",
    ),
    # cgroup probe: v1 or v2, detected at run time
    MetricSpec(
        "cgroup_memory_limit_bytes", "gauge", "Effective memory limit of the instance's cgroup.", "cgroup"
    ),
    MetricSpec(
        "cgroup_memory_usage_bytes", "gauge", "Memory charged to the cgroup, page cache included.", "cgroup"
    ),
    MetricSpec(
        "cgroup_memory_working_set_bytes", "gauge", "Cgroup usage minus inactive page cache.", "cgroup"
    ),
    MetricSpec("cgroup_memory_anon_bytes", "gauge", "Anonymous memory charged to the cgroup.", "cgroup"),
    MetricSpec("cgroup_memory_file_bytes", "gauge", "Page cache charged to the cgroup.", "cgroup"),
    MetricSpec("cgroup_oom_kills_total", "counter", "Processes OOM-killed in the cgroup.", "cgroup"),
    MetricSpec(
        "cgroup_memory_limit_hits_total",
        "counter",
        "Times usage hit the limit (v1 failcnt, v2 max).",
        "cgroup",
    ),
    MetricSpec(
        "cgroup_memory_pressure_some_seconds_total",
        "counter",
        "PSI: time some tasks stalled on memory.",
        "cgroup",
    ),
    MetricSpec(
        "cgroup_memory_pressure_full_seconds_total",
        "counter",
        "PSI: time all tasks stalled on memory.",
        "cgroup",
    ),
    MetricSpec(
        "cgroup_cpu_pressure_some_seconds_total", "counter", "PSI: time some tasks waited for CPU.", "cgroup"
    ),
    MetricSpec(
        "cgroup_cpu_quota_cores", "gauge", "CPU quota of the cgroup in cores (absent if unlimited).", "cgroup"
    ),
    MetricSpec("cgroup_cpu_periods_total", "counter", "CFS enforcement periods elapsed.", "cgroup"),
    MetricSpec(
        "cgroup_cpu_throttled_periods_total",
        "counter",
        "CFS periods in which the cgroup was throttled.",
        "cgroup",
    ),
    MetricSpec("cgroup_cpu_throttled_seconds_total", "counter", "Time the cgroup spent throttled.", "cgroup"),
    # latency probe: the instance's own histogram, summary or counters, per scrape interval (docs/latency.md)
    MetricSpec(
        "latency_p50_seconds",
        "gauge",
        "Median request latency over the last interval.",
        "latency",
        family=LATENCY_FAMILY,
        quantile="0.5",
    ),
    MetricSpec(
        "latency_p90_seconds",
        "gauge",
        "90th percentile latency over the last interval.",
        "latency",
        family=LATENCY_FAMILY,
        quantile="0.9",
    ),
    MetricSpec(
        "latency_p99_seconds",
        "gauge",
        "99th percentile latency over the last interval.",
        "latency",
        family=LATENCY_FAMILY,
        quantile="0.99",
    ),
    MetricSpec(
        "latency_p999_seconds",
        "gauge",
        "99.9th percentile latency, last interval.",
        "latency",
        family=LATENCY_FAMILY,
        quantile="0.999",
    ),
    MetricSpec("latency_mean_seconds", "gauge", "Mean request latency over the last interval.", "latency"),
    MetricSpec(
        "requests_total", "counter", "Requests served, as counted across the probe's scrapes.", "latency"
    ),
    MetricSpec(
        "errors_total", "counter", "Failed requests, as counted across the probe's scrapes.", "latency"
    ),
    MetricSpec(
        "request_rate",
        "gauge",
        "Requests per second over the last interval.",
        "latency",
        family=_NOT_EXPORTED,
    ),
    MetricSpec(
        "error_rate", "gauge", "Errors per second over the last interval.", "latency", family=_NOT_EXPORTED
    ),
    MetricSpec(
        "error_ratio", "gauge", "Errors per request over the last interval.", "latency", family=_NOT_EXPORTED
    ),
    # canary probe: one active request every canary interval
    MetricSpec("canary_latency_seconds", "gauge", "Latency of the last canary request.", "canary"),
    MetricSpec("canary_success", "gauge", "1 if the last canary request got a 2xx answer, else 0.", "canary"),
    # allocator probe: the target's hook socket (in-process Python hook or LD_PRELOAD shim); docs/allocators.md
    MetricSpec("allocator_allocated_bytes", "gauge", "Bytes in live allocations.", "allocator"),
    MetricSpec("allocator_active_bytes", "gauge", "Bytes in pages holding live allocations.", "allocator"),
    MetricSpec("allocator_resident_bytes", "gauge", "Allocator memory resident in RAM.", "allocator"),
    MetricSpec("allocator_mapped_bytes", "gauge", "Bytes the allocator has mapped from the OS.", "allocator"),
    MetricSpec("allocator_retained_bytes", "gauge", "Address space returned to the OS.", "allocator"),
    MetricSpec("allocator_metadata_bytes", "gauge", "Bytes of the allocator's own bookkeeping.", "allocator"),
    MetricSpec("allocator_free_bytes", "gauge", "Freed bytes the allocator still holds.", "allocator"),
    MetricSpec("allocator_purgeable_bytes", "gauge", "Free bytes a purge can return now.", "allocator"),
    MetricSpec("allocator_fragmentation_ratio", "gauge", "Resident over allocated bytes.", "allocator"),
    MetricSpec("pymalloc_allocated_blocks", "gauge", "Blocks held by Python's pymalloc.", "allocator"),
    # jvm probe: jcmd GC.heap_info, VM.native_memory summary, GC.class_histogram; docs/histograms.md
    MetricSpec("jvm_heap_used_bytes", "gauge", "Java heap in use, garbage included.", "jvm"),
    MetricSpec("jvm_heap_committed_bytes", "gauge", "Java heap committed by the JVM.", "jvm"),
    MetricSpec(
        "jvm_heap_after_gc_bytes", "gauge", "Java heap that survived the last young collection.", "jvm"
    ),
    MetricSpec("jvm_metaspace_used_bytes", "gauge", "Metaspace in use (class metadata).", "jvm"),
    MetricSpec(
        "jvm_nmt_committed_bytes", "gauge", "Memory committed as Native Memory Tracking sees it.", "jvm"
    ),
    MetricSpec("jvm_nmt_malloc_bytes", "gauge", "JVM-internal malloc seen by Native Memory Tracking.", "jvm"),
    MetricSpec(
        "jvm_nmt_heap_committed_bytes", "gauge", "Java heap committed, per Native Memory Tracking.", "jvm"
    ),
    MetricSpec(
        "jvm_heap_resident_bytes", "gauge", "Java heap pages resident in RAM (smaps of its range).", "jvm"
    ),
    MetricSpec("jvm_native_bytes", "gauge", "Resident memory outside the Java heap (RSS less it).", "jvm"),
    MetricSpec(
        "jvm_direct_bytes", "gauge", "Direct buffers and other Unsafe memory (NMT category Other).", "jvm"
    ),
    MetricSpec("jvm_histogram_bytes", "gauge", "Bytes of the objects in the last class histogram.", "jvm"),
    MetricSpec("jvm_histogram_instances", "gauge", "Objects in the last class histogram.", "jvm"),
    # jvm_limits probe: jcmd VM.flags, else the options the JVM started with; docs/jvm.md
    MetricSpec("jvm_heap_max_bytes", "gauge", "The Java heap's ceiling (MaxHeapSize, -Xmx).", "jvm_limits"),
    MetricSpec(
        "jvm_direct_max_bytes",
        "gauge",
        "The ceiling of direct buffers (MaxDirectMemorySize, else the heap's).",
        "jvm_limits",
    ),
    MetricSpec(
        "jvm_metaspace_max_bytes",
        "gauge",
        "The ceiling of metaspace (MaxMetaspaceSize, when set).",
        "jvm_limits",
    ),
    # pyhist probe: the in-process hook's type histogram
    MetricSpec("python_gc_objects", "gauge", "Objects tracked by Python's garbage collector.", "pyhist"),
    MetricSpec("python_gc_objects_bytes", "gauge", "Shallow size of the gc-tracked objects.", "pyhist"),
    # heapprof probe: jemalloc / gperftools heap profiles
    MetricSpec("heap_profile_live_bytes", "gauge", "Live bytes in the last heap profile.", "heapprof"),
    # agent: derived per tick
    MetricSpec(
        "process_start_time_seconds",
        "gauge",
        "Start time of the instance's process (unix seconds); a change marks a restart.",
        "agent",
    ),
    MetricSpec(
        "memory_limit_bytes",
        "gauge",
        "The memory limit medic judges the instance against (configured, else cgroup, else host RAM).",
        "agent",
    ),
]

CATALOG: dict[str, MetricSpec] = {spec.name: spec for spec in _SPECS}


def prometheus_name(metric: str) -> str:
    """The exported sample name of a stored metric: `rss_bytes` → `medic_rss_bytes`,
    `latency_p99_seconds` → `medic_latency_seconds`, "" for one that is not exported."""
    spec = CATALOG.get(metric)
    if spec is not None and spec.family is not None:
        return spec.family
    return f"medic_{metric}"


def _family_name(sample_name: str, kind: str) -> str:
    """prometheus_client names a counter family without its `_total`."""
    return sample_name.removesuffix("_total") if kind == "counter" else sample_name


def exported_families() -> dict[str, ExportedFamily]:
    """The families of `/metrics` made from the catalog, by family name."""
    families: dict[str, ExportedFamily] = {}
    for spec in _SPECS:
        name = prometheus_name(spec.name)
        if not name:
            continue
        if spec.quantile is not None:
            families.setdefault(
                name,
                ExportedFamily(
                    name, "summary", "Request latency quantiles over the last interval.", "quantile"
                ),
            )
        else:
            families[_family_name(name, spec.kind)] = ExportedFamily(
                _family_name(name, spec.kind), spec.kind, spec.help
            )
    return families


def exported_sample(metric: str) -> tuple[str, tuple[str, str] | None] | None:
    """Where a stored metric goes on `/metrics`: its family name and the extra label, or None."""
    spec = CATALOG.get(metric)
    if spec is None:
        return None
    name = prometheus_name(metric)
    if not name:
        return None
    if spec.quantile is not None:
        return name, ("quantile", spec.quantile)
    return _family_name(name, spec.kind), None
