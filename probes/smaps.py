"""The `smaps` probe: PSS, USS and proportional swap from `/proc/PID/smaps_rollup`.

`smaps_rollup` makes the kernel walk the target's page tables under its mmap lock: about 11 ms per
GiB of RSS, more with many mappings. So it runs on the slow schedule, and full `smaps` is never read.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from agent.core.errors import ProbeError, ProbeUnavailable, TargetGone
from agent.core.records import ProbeResult, ProbeTarget
from probes.base import Schedule
from probes.linux import procfs
from probes.process import add_samples


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
