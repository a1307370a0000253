"""The `cgroup` probe: the memory limit, usage and pressure of a process's cgroup, and CPU throttling.

Works on cgroup v1, v2 and hybrid hosts (detected at run time, see `probes.linux.cgroupfs`). The
directories of a process, and its CPU quota (a setting, not a counter), are read once per (pid,
start time) and again every `RELOCATE_AFTER` seconds, in case the process was moved or resized.
Figures this host does not have are left out; files that cannot be read are reported as problems. Liveness is the `process` probe's job: cgroup files outlive
the processes in them, so this probe does not reread `/proc/PID/stat` every tick.

For "memory_limit: auto" use `probes.linux.cgroupfiles.cgroup_memory_limit(pid)`, then
`probes.linux.procfs.host_memory_total()`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from agent.core.records import ProbeResult, ProbeTarget, Sample
from probes.base import Schedule
from probes.linux import cgroupfiles
from probes.linux.cgroupfiles import CpuQuota
from probes.linux.cgroupfs import CgroupLocation, locate_cgroups
from probes.linux.procfs import HOST_ROOT

RELOCATE_AFTER = 60.0  # seconds


@dataclass(frozen=True, slots=True)
class _Located:
    """Where a process's cgroups are, found at `when`, with the settings that rarely change."""

    location: CgroupLocation
    when: float
    cpu_quota: CpuQuota | None
    problems: tuple[Exception, ...]


class CgroupProbe:
    name: ClassVar[str] = "cgroup"
    schedule: ClassVar[Schedule] = "fast"

    def __init__(self, root: Path = HOST_ROOT) -> None:
        self.root = root
        self._located: dict[tuple[int, float], _Located] = {}
        # the last tick's reading: instances in one cgroup share it (the figures this host has, as floats)
        self._tick_key: tuple[CgroupLocation, float] | None = None
        self._tick_reading: tuple[list[tuple[str, float]], list[Exception], bool] = ([], [], False)
        self._locations: dict[CgroupLocation, CgroupLocation] = {}  # one object per place: `is` finds it

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        key = (target.pid, target.start_time)
        located = self._located.get(key)
        if located is None or not 0 <= now - located.when < RELOCATE_AFTER:
            located = self._located[key] = self._locate(target, now)
        result, stale = self._read(located, target, now)
        if stale:  # the cgroup was removed under us: find where the process is now
            located = self._located[key] = self._locate(target, now)
            result, _ = self._read(located, target, now)
        if result.problems and not result.samples:
            raise result.problems[0]
        return result

    def forget(self, target: ProbeTarget) -> None:
        self._located.pop((target.pid, target.start_time), None)

    def _locate(self, target: ProbeTarget, now: float) -> _Located:
        location = locate_cgroups(target.pid, self.root)
        if len(self._locations) > 4096:
            self._locations.clear()
        location = self._locations.setdefault(location, location)
        problems: list[Exception] = []
        quota = cgroupfiles.read_cpu_quota(location.cpu, problems) if location.cpu else None
        return _Located(location, now, quota, tuple(problems))

    def _read(self, located: _Located, target: ProbeTarget, now: float) -> tuple[ProbeResult, bool]:
        """Samples for `target`; processes that share a cgroup share one reading per tick (`now`)."""
        key = (located.location, now)
        if self._tick_key != key:
            figures, problems, stale = self._figures(located)
            known = [(metric, float(value)) for metric, value in figures.items() if value is not None]
            self._tick_key, self._tick_reading = key, (known, problems, stale)
        known, problems, stale = self._tick_reading
        instance = target.instance
        result = ProbeResult(
            [Sample(instance, metric, now, value) for metric, value in known],
            [*located.problems, *problems],
        )
        return result, stale

    def _figures(self, located: _Located) -> tuple[dict[str, float | None], list[Exception], bool]:
        location = located.location
        figures: dict[str, float | None] = {}
        problems: list[Exception] = []
        stale = False
        if location.memory:
            memory = cgroupfiles.read_memory(location.memory, problems)
            stale |= memory.usage_bytes is None and not os.path.isdir(location.memory.path)
            figures.update(
                {
                    "cgroup_memory_limit_bytes": memory.limit_bytes,
                    "cgroup_memory_usage_bytes": memory.usage_bytes,
                    "cgroup_memory_working_set_bytes": memory.working_set_bytes,
                    "cgroup_memory_anon_bytes": memory.anon_bytes,
                    "cgroup_memory_file_bytes": memory.file_bytes,
                    "cgroup_oom_kills_total": memory.oom_kills,
                    "cgroup_memory_limit_hits_total": memory.limit_hits,
                },
            )
        if location.cpu:
            cpu = cgroupfiles.read_cpu(location.cpu, problems)
            stale |= cpu.periods is None and not os.path.isdir(location.cpu.path)
            figures.update(
                {
                    "cgroup_cpu_quota_cores": located.cpu_quota.quota_cores if located.cpu_quota else None,
                    "cgroup_cpu_periods_total": cpu.periods,
                    "cgroup_cpu_throttled_periods_total": cpu.throttled_periods,
                    "cgroup_cpu_throttled_seconds_total": cpu.throttled_seconds,
                },
            )
        if location.unified:
            memory_psi = cgroupfiles.read_pressure(location.unified, "memory", problems)
            cpu_psi = cgroupfiles.read_pressure(location.unified, "cpu", problems)
            stale |= memory_psi is None and cpu_psi is None and not os.path.isdir(location.unified.path)
            figures.update(
                {
                    "cgroup_memory_pressure_some_seconds_total": memory_psi.some.total_seconds
                    if memory_psi
                    else None,
                    "cgroup_memory_pressure_full_seconds_total": (
                        memory_psi.full.total_seconds if memory_psi and memory_psi.full else None
                    ),
                    "cgroup_cpu_pressure_some_seconds_total": cpu_psi.some.total_seconds if cpu_psi else None,
                },
            )
        return figures, problems, stale
