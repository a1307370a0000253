"""What a cgroup's files say, on v1 and v2: parsers of each file format and the readers built on them.

Figures: memory limit (min over ancestors), usage, working set, anon/file, OOM kills, limit hits,
PSI, CPU quota and throttling; `read_memory`, `read_cpu`, `read_pressure`. The directories come
from `probes.linux.cgroupfs.locate_cgroups`. A file that does not exist is a figure this host lacks
and is left out (None); a file that cannot be read is recorded in the caller's `problems` list. Pure
`parse_*` functions raise `ProbeError` on malformed content.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from agent.core.errors import ProbeAccessDenied, ProbeError
from probes.linux.cgroupfs import ControllerDir, ancestors, locate_cgroups, malformed, to_int
from probes.linux.procfs import HOST_ROOT, read_head, read_raw

# v1 reports "no limit" as the largest page-aligned long: 9223372036854771712 with 4 KiB pages, a
# little less with bigger pages. No real limit comes near 2**62 bytes (4 EiB).
V1_UNLIMITED_THRESHOLD = 2**62

T = TypeVar("T")


# --------------------------------------------------------------------------- file formats


def parse_int(data: bytes, what: str) -> int:
    """A file holding one integer (`memory.usage_in_bytes`, `memory.current`, `cpu.cfs_quota_us`)."""
    text = data.strip()
    if not text or b"\n" in text:
        raise malformed(what, "expected one integer", data)
    return to_int(text, what, data)


def parse_v1_limit(data: bytes, what: str = "memory.limit_in_bytes") -> int | None:
    """A v1 byte limit; the "unlimited" sentinel (about 2**63) becomes None."""
    value = parse_int(data, what)
    return None if value >= V1_UNLIMITED_THRESHOLD else value


def parse_v2_limit(data: bytes, what: str = "memory.max") -> int | None:
    """A v2 limit (`memory.max`, `memory.high`): `max` means none."""
    return None if data.strip() == b"max" else parse_int(data, what)


def parse_flat_keyed(data: bytes, what: str) -> dict[str, int]:
    """`key value` lines (`memory.events`, `cpu.stat`, `memory.oom_control`)."""
    table = {}
    for line in data.split(b"\n"):
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise malformed(what, f"line {line[:60]!r} is not 'key value'", data)
        table[parts[0].decode("ascii", "replace")] = to_int(parts[1], what, data)
    return table


# Anchored on newlines (the data gets one prepended): five times faster than splitting ~70 lines.
_MEMORY_STAT_LINE = re.compile(
    rb"\n(hierarchical_memory_limit|total_inactive_file|total_rss|total_cache|inactive_file|rss|cache|anon|file)"
    rb" (\d{1,30})$",
    re.MULTILINE,
)


def parse_memory_stat(data: bytes) -> dict[str, int]:
    """The fields of `memory.stat` medic uses (v1: rss, cache, total_*, hierarchical_memory_limit; v2: anon,
    file, inactive_file); a file with none of them is malformed."""
    fields = {key.decode(): int(value) for key, value in _MEMORY_STAT_LINE.findall(b"\n" + data)}
    if not fields:
        raise malformed("memory.stat", "none of rss, cache, anon, file, inactive_file", data)
    return fields


@dataclass(frozen=True, slots=True)
class PressureLine:
    avg10: float
    avg60: float
    avg300: float
    total_seconds: float  # cumulative stall time (the file gives µs)


@dataclass(frozen=True, slots=True)
class Pressure:
    some: PressureLine
    full: PressureLine | None  # cpu.pressure at the root has no `full` line on older kernels


_PRESSURE_LINE = re.compile(
    rb"(some|full) avg10=(\d{1,9}\.\d{1,9}) avg60=(\d{1,9}\.\d{1,9}) avg300=(\d{1,9}\.\d{1,9}) total=(\d{1,30})"
)


def parse_pressure(data: bytes, what: str = "pressure") -> Pressure:
    """PSI: `some|full avg10=<%> avg60=<%> avg300=<%> total=<µs>` (kernel Documentation/accounting/psi.rst)."""
    lines: dict[bytes, PressureLine] = {}
    for line in data.split(b"\n"):
        if not line:
            continue
        match = _PRESSURE_LINE.fullmatch(line)
        if not match:
            raise malformed(what, f"line {line[:60]!r} is not 'some|full avg10= avg60= avg300= total='", data)
        kind, avg10, avg60, avg300, total = match.groups()
        lines[kind] = PressureLine(float(avg10), float(avg60), float(avg300), int(total) / 1e6)
    if b"some" not in lines:
        raise malformed(what, "no 'some' line", data)
    return Pressure(lines[b"some"], lines.get(b"full"))


@dataclass(frozen=True, slots=True)
class CpuQuota:
    quota_cores: float | None  # None: unlimited
    period_seconds: float


def parse_cpu_max(data: bytes) -> CpuQuota:
    """v2 `cpu.max`: `max 100000` or `<quota µs> <period µs>`."""
    parts = data.split()
    if len(parts) != 2:
        raise malformed("cpu.max", "expected '<quota|max> <period>'", data)
    period = to_int(parts[1], "cpu.max", data)
    if period <= 0:
        raise malformed("cpu.max", "the period must be positive", data)
    if parts[0] == b"max":
        return CpuQuota(None, period / 1e6)
    return CpuQuota(to_int(parts[0], "cpu.max", data) / period, period / 1e6)


def v1_cpu_quota(quota_us: int, period_us: int) -> CpuQuota:
    """v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`; a quota of -1 means unlimited."""
    if period_us <= 0:
        raise ProbeError(f"cpu.cfs_period_us is {period_us}; expected a positive number of microseconds")
    return CpuQuota(None if quota_us < 0 else quota_us / period_us, period_us / 1e6)


# --------------------------------------------------------------------------- readers


_ABSENT_ERRNOS = {errno.ENOENT, errno.EOPNOTSUPP, errno.ENODEV}


def read_optional(path: str, problems: list[Exception]) -> bytes | None:
    """A cgroup file's content; None if this host lacks it; unreadable files go to `problems`."""
    try:
        return read_raw(path)
    except PermissionError:
        problems.append(ProbeAccessDenied(f"permission denied reading {path}: run medic as root"))
    except OSError as exc:
        if exc.errno not in _ABSENT_ERRNOS:  # EOPNOTSUPP: PSI compiled in but disabled (psi=0)
            problems.append(ProbeError(f"cannot read {path}: {exc.strerror or exc}"))
    return None


def _parsed(path: str, problems: list[Exception], parse: Callable[..., T], *args: object) -> T | None:
    """`parse(content, *args)` of an optional file; a malformed one goes to `problems`."""
    data = read_optional(path, problems)
    if data is None:
        return None
    try:
        return parse(data, *args)
    except ProbeError as exc:
        problems.append(ProbeError(f"{path}: {exc}"))
        return None


@dataclass(frozen=True, slots=True)
class CgroupMemory:
    limit_bytes: int | None = None  # effective: the smallest limit on the way to the top
    usage_bytes: int | None = None
    working_set_bytes: int | None = None
    anon_bytes: int | None = None
    file_bytes: int | None = None
    oom_kills: int | None = None
    limit_hits: int | None = None


def effective_limit(directory: ControllerDir, problems: list[Exception]) -> int | None:
    """The smallest memory limit of the directory and its ancestors (None: unlimited)."""
    name, parse = (
        ("memory.limit_in_bytes", parse_v1_limit)
        if directory.version == 1
        else ("memory.max", parse_v2_limit)
    )
    limits = [_parsed(f"{path}/{name}", problems, parse, f"{path}/{name}") for path in ancestors(directory)]
    known = [limit for limit in limits if limit is not None]
    return min(known) if known else None


def read_memory(directory: ControllerDir, problems: list[Exception]) -> CgroupMemory:
    return (_read_memory_v1 if directory.version == 1 else _read_memory_v2)(directory, problems)


def _read_memory_v1(directory: ControllerDir, problems: list[Exception]) -> CgroupMemory:
    path = directory.path
    usage = _parsed(f"{path}/memory.usage_in_bytes", problems, parse_int, "memory.usage_in_bytes")
    stat = _parsed(f"{path}/memory.stat", problems, parse_memory_stat) or {}
    oom = _parsed(f"{path}/memory.oom_control", problems, parse_flat_keyed, "memory.oom_control") or {}
    failcnt = _parsed(f"{path}/memory.failcnt", problems, parse_int, "memory.failcnt")
    # hierarchical_memory_limit is already the minimum over every ancestor, even those outside a container.
    hierarchical = stat.get("hierarchical_memory_limit")
    if hierarchical is not None:
        limit = None if hierarchical >= V1_UNLIMITED_THRESHOLD else hierarchical
    else:
        limit = effective_limit(directory, problems)
    inactive_file = stat.get("total_inactive_file", stat.get("inactive_file"))
    return CgroupMemory(
        limit_bytes=limit,
        usage_bytes=usage,
        working_set_bytes=_working_set(usage, inactive_file),
        anon_bytes=stat.get("total_rss", stat.get("rss")),
        file_bytes=stat.get("total_cache", stat.get("cache")),
        oom_kills=oom.get("oom_kill"),
        limit_hits=failcnt,
    )


def _read_memory_v2(directory: ControllerDir, problems: list[Exception]) -> CgroupMemory:
    path = directory.path
    usage = _parsed(f"{path}/memory.current", problems, parse_int, "memory.current")
    stat = _parsed(f"{path}/memory.stat", problems, parse_memory_stat) or {}
    events = _parsed(f"{path}/memory.events", problems, parse_flat_keyed, "memory.events") or {}
    return CgroupMemory(
        limit_bytes=effective_limit(directory, problems),
        usage_bytes=usage,
        working_set_bytes=_working_set(usage, stat.get("inactive_file")),
        anon_bytes=stat.get("anon"),
        file_bytes=stat.get("file"),
        oom_kills=events.get("oom_kill"),
        limit_hits=events.get("max"),
    )


def _working_set(usage: int | None, inactive_file: int | None) -> int | None:
    """What the kernel cannot easily reclaim: usage minus inactive page cache (as kubelet computes it)."""
    if usage is None or inactive_file is None:
        return None
    return max(0, usage - inactive_file)


@dataclass(frozen=True, slots=True)
class CgroupCpu:
    periods: int | None = None
    throttled_periods: int | None = None
    throttled_seconds: float | None = None


def read_cpu(directory: ControllerDir, problems: list[Exception]) -> CgroupCpu:
    """CFS throttling counters (v1 `throttled_time` is in ns, v2 `throttled_usec` in µs)."""
    stat = _parsed(f"{directory.path}/cpu.stat", problems, parse_flat_keyed, "cpu.stat") or {}
    if directory.version == 1:
        throttled_ns = stat.get("throttled_time")
        throttled = throttled_ns / 1e9 if throttled_ns is not None else None
    else:
        throttled_us = stat.get("throttled_usec")
        throttled = throttled_us / 1e6 if throttled_us is not None else None
    return CgroupCpu(stat.get("nr_periods"), stat.get("nr_throttled"), throttled)


def read_cpu_quota(directory: ControllerDir, problems: list[Exception]) -> CpuQuota | None:
    """The CPU quota of the directory itself (v1 cfs_quota_us/cfs_period_us, v2 cpu.max); None if unreadable."""
    path = directory.path
    if directory.version == 2:
        return _parsed(f"{path}/cpu.max", problems, parse_cpu_max)
    quota_us = _parsed(f"{path}/cpu.cfs_quota_us", problems, parse_int, "cpu.cfs_quota_us")
    period_us = _parsed(f"{path}/cpu.cfs_period_us", problems, parse_int, "cpu.cfs_period_us")
    if quota_us is None or period_us is None:
        return None
    try:
        return v1_cpu_quota(quota_us, period_us)
    except ProbeError as exc:
        problems.append(exc)
        return None


def read_pressure(directory: ControllerDir, resource: str, problems: list[Exception]) -> Pressure | None:
    """PSI of one resource (`memory`, `cpu`, `io`) for a v2 directory; None where PSI is absent."""
    name = f"{resource}.pressure"
    return _parsed(f"{directory.path}/{name}", problems, parse_pressure, name)


def cgroup_memory_limit(pid: int, root: Path = HOST_ROOT) -> int | None:
    """The effective memory limit of `pid`'s cgroup in bytes, or None when nothing limits it.

    Raises `TargetGone` for a vanished pid and `ProbeError` when the limit files cannot be read.
    """
    location = locate_cgroups(pid, root)
    if location.memory is None:
        return None
    problems: list[Exception] = []
    if location.memory.version == 1:
        stat = _parsed(f"{location.memory.path}/memory.stat", problems, parse_memory_stat) or {}
        hierarchical = stat.get("hierarchical_memory_limit")
        if hierarchical is not None and not problems:
            return None if hierarchical >= V1_UNLIMITED_THRESHOLD else hierarchical
    limit = effective_limit(location.memory, problems)
    if problems:
        raise problems[0]
    return limit


# --------------------------------------------------------------------------- who is in a cgroup


def parse_cgroup_procs(data: bytes, what: str = "cgroup.procs") -> list[int]:
    """The pids of a `cgroup.procs` file, one per line."""
    return [to_int(line, what, data) for line in data.split()]


def cgroup_members(directory: ControllerDir, limit: int) -> tuple[int, ...] | None:
    """The pids in `directory` when it holds at most `limit` processes and has no child cgroups;
    None otherwise, or when it cannot be read: the cgroup then holds more than one instance's tree
    (its usage is not the instance's), so the caller falls back to per-process figures."""
    try:
        if has_subdirectories(directory.path):
            return None
        pids = parse_cgroup_procs(read_head(directory.path + "/cgroup.procs", 16 * (limit + 1)))
    except (OSError, ProbeError):
        return None
    return tuple(pids) if len(pids) <= limit else None


def has_subdirectories(path: str) -> bool:
    """Whether a directory has child directories. A cgroup directory's link count is 2 plus its
    children (kernfs keeps it, like most file systems), so one `stat` says "none"; any other count
    (a file system that does not keep it) is checked entry by entry."""
    if os.stat(path).st_nlink == 2:
        return False
    with os.scandir(path) as entries:
        return any(entry.is_dir(follow_symlinks=False) for entry in entries)
