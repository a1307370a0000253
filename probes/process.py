"""The `process` probe: memory, CPU, threads, fds, faults and context switches of one process.

Reads the cheapest /proc files that hold each figure, every tick: `stat` (CPU, threads, faults),
`status` (RSS and VMS, RSS by kind, peak, swap, context switches; `statm` only where status has no
RSS, as for a kernel thread) and the number of entries of `fd`, through the process's /proc
directory held open from the first tick (`probes.linux.procdir`: the identity is checked once, and a
reused pid can never be read). `smaps_rollup` is left to the slow `smaps` probe. The workers of the
instance (`target.workers`) cost one `stat` and one `statm` read each, by path: their RSS and CPU go
to `ProbeResult.processes`; a worker that exited meanwhile is left out (the tracker says so).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import ClassVar, TypeVar

from agent.core.errors import ProbeError, TargetGone
from agent.core.records import ProbeResult, ProbeTarget, ProcessIdentity, Sample
from probes.base import Schedule
from probes.linux import procfs
from probes.linux.procdir import ProcDir, ProcDirs

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
    instance = target.instance
    result.samples += [
        Sample(instance, metric, now, float(value)) for metric, value in values.items() if value is not None
    ]


class ProcessProbe:
    name: ClassVar[str] = "process"
    schedule: ClassVar[Schedule] = "fast"

    def __init__(self, root: Path = procfs.HOST_ROOT) -> None:
        self.root = root
        self.dirs = ProcDirs(root)  # each followed process's /proc directory, held open

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        main = ProcessIdentity(target.pid, target.start_time)
        result = ProbeResult()
        with self.dirs.using(main) as proc:
            stat = proc.stat()  # failure here is total
            status = try_read(result, proc.status)
            rss = vms = None
            if status is not None and status.rss_bytes is not None:
                rss, vms = status.rss_bytes, status.vms_bytes  # the figures statm holds, in kB
            else:  # a kernel thread's status has no Vm lines; statm says 0
                statm = try_read(result, proc.statm)
                if statm is not None:
                    rss, vms = statm.rss_bytes, statm.vms_bytes
            fds = try_read(result, proc.count_fds)
        figures: list[tuple[str, float | None]] = [
            ("cpu_seconds_total", stat.cpu_seconds),
            ("threads", stat.threads),
            ("minor_faults_total", stat.minor_faults),
            ("major_faults_total", stat.major_faults),
            ("rss_bytes", rss),
            ("vms_bytes", vms),
        ]
        if status is not None:
            figures += (
                ("rss_anon_bytes", status.rss_anon_bytes),
                ("rss_file_bytes", status.rss_file_bytes),
                ("rss_shmem_bytes", status.rss_shmem_bytes),
                ("rss_peak_bytes", status.rss_peak_bytes),
                ("swap_bytes", status.swap_bytes),
                ("ctx_switches_voluntary_total", status.voluntary_ctx_switches),
                ("ctx_switches_involuntary_total", status.involuntary_ctx_switches),
            )
        figures.append(("open_fds", fds))
        instance = target.instance
        result.samples = [Sample(instance, metric, now, float(v)) for metric, v in figures if v is not None]
        if rss is not None:
            result.processes[main] = {"rss_bytes": rss, "cpu_seconds_total": stat.cpu_seconds}
        add_workers(result, target.workers, self._worker)
        return result

    def _worker(self, worker: ProcessIdentity) -> dict[str, float]:
        """RSS and CPU of one worker (by path: workers come and go, no directory is held for them)."""
        proc = ProcDir(worker, self.root, hold=False)
        stat = proc.stat()
        statm = proc.statm()
        return {"rss_bytes": statm.rss_bytes, "cpu_seconds_total": stat.cpu_seconds}

    def forget(self, target: ProbeTarget) -> None:
        """The process is no longer followed: its /proc directory is closed."""
        self.dirs.forget(ProcessIdentity(target.pid, target.start_time))
