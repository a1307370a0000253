"""The `jvm_limits` probe: the ceilings a JVM enforces on its own memory (`-Xmx`, direct buffers,
metaspace), the limits a leak in each of those layers really hits (docs/jvm.md).

Read once per process: `jcmd PID VM.flags`, the JVM's own account, run like the `jvm` probe's jcmd
(a trusted jcmd, as the JVM's user, within `histograms.jvm.timeout`, never against a JVM that refuses
attach). When jcmd cannot answer, the options the JVM started with stand in (`probes/jvmflags.py`),
and VM.flags is asked again later (after 1 min, doubling up to 1 h; never when the JVM refuses
attach). Every run returns the reading it holds: `jvm_heap_max_bytes`, `jvm_direct_max_bytes`,
`jvm_metaspace_max_bytes` (only the ceilings that exist), and as notes where they came from
(`jvm_limits_source`: `VM.flags`, `command line` or `unknown`), the flags (`jvm_limits_detail`) and
why VM.flags was not read (`jvm_limits_problem`). A JVM whose ceilings cannot be read is not an error:
the agent then projects its growth to the container limit and says so (`agent/watch/ceilings.py`).
A process that is not a JVM gets nothing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from agent.core.errors import ProbeError, TargetGone
from agent.core.records import ProbeResult, ProbeTarget, Sample
from probes.base import Schedule
from probes.jcmd import attach_refusal, is_jvm, run_jcmd
from probes.jvmflags import JvmLimits, limits_from_options, limits_from_vm_flags, startup_options
from probes.linux.cgroupfiles import cgroup_memory_limit
from probes.linux.procfs import HOST_ROOT, host_memory_total, read_cmdline, read_environ
from probes.settings import JvmHistograms, settings_for

RETRY_FIRST = 60.0  # VM.flags is asked again this long after a failure, doubling...
RETRY_MAX = 3600.0  # ...up to this
SOURCE, DETAIL, PROBLEM = "jvm_limits_source", "jvm_limits_detail", "jvm_limits_problem"


@dataclass(slots=True)
class _Reading:
    limits: JvmLimits | None
    problem: str | None = None  # why VM.flags was not read
    retry_at: float | None = None  # when to ask VM.flags again (None: read, or never: attach refused)
    backoff: float = RETRY_FIRST


class JvmLimitsProbe:
    name: ClassVar[str] = "jvm_limits"
    schedule: ClassVar[Schedule] = "slow"

    def __init__(self, root: Path = HOST_ROOT) -> None:
        self.root = root
        self._readings: dict[tuple[str, int, float], _Reading | None] = {}  # None: not a JVM
        self._lock = threading.Lock()

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        key = (target.instance, target.pid, target.start_time)
        with self._lock:
            known = key in self._readings
            reading = self._readings.get(key)
        if not known:
            if not is_jvm(target.pid, self.root):
                with self._lock:
                    self._readings[key] = None
                return ProbeResult()
            reading = self._read(target, now, None)
        elif reading is None:
            return ProbeResult()
        elif reading.retry_at is not None and now >= reading.retry_at:
            reading = self._read(target, now, reading)
        with self._lock:
            self._readings[key] = reading
        return _result(target, now, reading)

    def forget(self, target: ProbeTarget) -> None:
        with self._lock:
            self._readings.pop((target.instance, target.pid, target.start_time), None)

    def _read(self, target: ProbeTarget, now: float, before: _Reading | None) -> _Reading:
        """VM.flags when jcmd answers, else the options the JVM started with."""
        pid = target.pid
        refusal = attach_refusal(pid, self.root)
        if isinstance(refusal, TargetGone):
            raise refusal
        retry = None
        backoff = RETRY_FIRST if before is None else min(before.backoff * 2, RETRY_MAX)
        if refusal is not None:  # a JVM refusing attach refuses it for its whole life
            problem = str(refusal).split(": ", 1)[0]  # what it runs with, not what the jvm probe misses
        else:
            try:
                answer = run_jcmd(pid, ["VM.flags"], settings_for(target, "jvm", JvmHistograms), self.root)
            except TargetGone:
                raise
            except ProbeError as exc:
                problem, retry = f"jcmd VM.flags failed: {exc}", now + backoff
            else:
                limits = limits_from_vm_flags(answer)
                if limits is not None:
                    return _Reading(limits)
                problem, retry = "jcmd VM.flags named no MaxHeapSize", now + backoff
        return _Reading(self._from_options(pid), problem, retry, backoff)

    def _from_options(self, pid: int) -> JvmLimits | None:
        argv = read_cmdline(pid, self.root)
        try:
            environ = read_environ(pid, self.root)
        except TargetGone:
            raise
        except ProbeError:
            environ = {}  # another user's process without ptrace access: the command line alone
        try:
            cgroup = cgroup_memory_limit(pid, self.root)
        except TargetGone:
            raise
        except ProbeError:
            cgroup = None
        return limits_from_options(startup_options(argv, environ), cgroup, host_memory_total(self.root))


def _result(target: ProbeTarget, now: float, reading: _Reading) -> ProbeResult:
    limits = reading.limits
    notes = {
        SOURCE: limits.source if limits is not None else "unknown",
        DETAIL: limits.detail if limits is not None else "",
        PROBLEM: reading.problem or "",
    }
    if limits is None:
        return ProbeResult(notes=notes)
    figures = {
        "jvm_heap_max_bytes": limits.heap,
        "jvm_direct_max_bytes": limits.direct,
        "jvm_metaspace_max_bytes": limits.metaspace,
    }
    samples = [Sample(target.instance, m, now, float(v)) for m, v in figures.items() if v is not None]
    return ProbeResult(samples=samples, notes=notes)
