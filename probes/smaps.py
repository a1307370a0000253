"""The `smaps` probe: PSS, USS and proportional swap from `/proc/PID/smaps_rollup`.

`smaps_rollup` makes the kernel walk the target's page tables under its mmap lock: about 11 ms per
GiB of RSS, more with many mappings. So it runs on the slow schedule, and full `smaps` is never read.
Each worker of the instance (`target.workers`) is read too, into `ProbeResult.processes`: summed,
their PSS is the tree's memory with each shared (copy-on-write) page counted once.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from agent.core.errors import ProbeError, ProbeUnavailable, TargetGone
from agent.core.records import ProbeResult, ProbeTarget, ProcessIdentity
from probes.base import Schedule
from probes.linux import procfs
from probes.process import add_samples, add_workers


def read_pss(process: ProcessIdentity, root: Path = procfs.HOST_ROOT) -> dict[str, float]:
    """PSS and USS of one process of a tree, checked to be still the same process after the read."""
    rollup = procfs.read_smaps_rollup(process.pid, root)
    procfs.read_live_stat(process.pid, process.start_time, root)
    return {"pss_bytes": rollup.pss_bytes, "uss_bytes": rollup.uss_bytes}


class SmapsProbe:
    name: ClassVar[str] = "smaps"
    schedule: ClassVar[Schedule] = "slow"

    def __init__(self, root: Path = procfs.HOST_ROOT) -> None:
        self.root = root

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        procfs.read_live_stat(target.pid, target.start_time, self.root)  # ~20 µs next to milliseconds
        try:
            rollup = procfs.read_smaps_rollup(target.pid, self.root)
        except ProbeError as exc:
            procfs.read_live_stat(target.pid, target.start_time, self.root)  # exited meanwhile: TargetGone
            if isinstance(exc, TargetGone):  # ESRCH from a live pid: it has no memory map
                raise ProbeUnavailable(
                    f"pid {target.pid} has no memory map (a kernel thread?): no PSS/USS"
                ) from None
            raise
        result = ProbeResult()
        main = ProcessIdentity(target.pid, target.start_time)
        result.processes[main] = {"pss_bytes": rollup.pss_bytes, "uss_bytes": rollup.uss_bytes}
        add_workers(result, target.workers, lambda worker: read_pss(worker, self.root))
        add_samples(
            result,
            target,
            now,
            {
                "pss_bytes": rollup.pss_bytes,
                "uss_bytes": rollup.uss_bytes,
                "swap_pss_bytes": rollup.swap_pss_bytes,
            },
        )
        return result

    def forget(self, target: ProbeTarget) -> None:
        """Nothing is cached per target."""
