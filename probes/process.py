"""The `process` probe: memory, CPU, threads, fds, faults and context switches of one process.

Reads the cheapest /proc files that hold each figure, every tick: `stat` (CPU, threads, faults, and
the identity check), `statm` (RSS, VMS), `status` (RSS by kind, peak, swap, context switches) and the
entries of `fd`. About 100 µs of CPU per process; `smaps_rollup` is left to the slow `smaps` probe.
The workers of the instance (`target.workers`) cost one `stat` and one `statm` read each: their RSS
and CPU go to `ProbeResult.processes`; a worker that exited meanwhile is left out (the tracker says so).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import ClassVar, TypeVar

from agent.core.errors import ProbeError, TargetGone
from agent.core.records import ProbeResult, ProbeTarget, ProcessIdentity, Sample
from probes.base import Schedule
from probes.linux import procfs

T = TypeVar("T")


def try_read(result: ProbeResult, read: Callable[[], T]) -> T | None:
    """Run one read; its failure goes to `result.problems`, except a vanished target, which ends the probe."""
    try:
        return read()
    except TargetGone:
        raise
    except ProbeError as exc:
        result.problems.append(exc)
        return None


def add_workers(
    result: ProbeResult,
    workers: Iterable[ProcessIdentity],
    read: Callable[[ProcessIdentity], dict[str, float]],
) -> None:
    """Each worker's figures (`read(worker)`) into `result.processes`: a worker that exited meanwhile
    is left out (the tracker says so), one that cannot be read is a problem of the run."""
    for worker in workers:
        try:
            result.processes[worker] = read(worker)
        except TargetGone:
            continue
        except ProbeError as exc:
            result.problems.append(exc)


def add_samples(
    result: ProbeResult, target: ProbeTarget, now: float, values: dict[str, float | None]
) -> None:
    """Append one sample per known value; None means "not available here" and is left out."""
    for metric, value in values.items():
        if value is not None:
            result.samples.append(Sample(target.instance, metric, now, float(value)))


class ProcessProbe:
    name: ClassVar[str] = "process"
    schedule: ClassVar[Schedule] = "fast"

    def __init__(self, root: Path = procfs.HOST_ROOT) -> None:
        self.root = root

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        stat = procfs.read_live_stat(target.pid, target.start_time, self.root)  # failure here is total
        result = ProbeResult()
        add_samples(
            result,
            target,
            now,
            {
                "cpu_seconds_total": stat.cpu_seconds,
                "threads": stat.threads,
                "minor_faults_total": stat.minor_faults,
                "major_faults_total": stat.major_faults,
            },
        )
        statm = try_read(result, lambda: procfs.read_statm(target.pid, self.root))
        if statm:
            add_samples(result, target, now, {"rss_bytes": statm.rss_bytes, "vms_bytes": statm.vms_bytes})
            main = ProcessIdentity(target.pid, target.start_time)
            result.processes[main] = {"rss_bytes": statm.rss_bytes, "cpu_seconds_total": stat.cpu_seconds}
        add_workers(result, target.workers, self._worker)
        status = try_read(result, lambda: procfs.read_status(target.pid, self.root))
        if status:
            add_samples(
                result,
                target,
                now,
                {
                    "rss_anon_bytes": status.rss_anon_bytes,
                    "rss_file_bytes": status.rss_file_bytes,
                    "rss_shmem_bytes": status.rss_shmem_bytes,
                    "rss_peak_bytes": status.rss_peak_bytes,
                    "swap_bytes": status.swap_bytes,
                    "ctx_switches_voluntary_total": status.voluntary_ctx_switches,
                    "ctx_switches_involuntary_total": status.involuntary_ctx_switches,
                },
            )
        add_samples(
            result,
            target,
            now,
            {"open_fds": try_read(result, lambda: procfs.count_fds(target.pid, self.root))},
        )
        return result

    def _worker(self, worker: ProcessIdentity) -> dict[str, float]:
        """RSS and CPU of one worker."""
        stat = procfs.read_live_stat(worker.pid, worker.start_time, self.root)
        statm = procfs.read_statm(worker.pid, self.root)
        return {"rss_bytes": statm.rss_bytes, "cpu_seconds_total": stat.cpu_seconds}

    def forget(self, target: ProbeTarget) -> None:
        """Nothing is cached per target."""
