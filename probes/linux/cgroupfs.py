"""Cgroup discovery and parsing for v1, v2 and hybrid hosts, in one place.

Discovery: `/proc/PID/cgroup` says which cgroup a process is in, per hierarchy; `/proc/self/mountinfo`
says where each hierarchy is mounted (and which part of it: the mount root, which differs from `/`
inside containers). Together they give each controller's directory (`locate_cgroups`). The layout
is detected at run time: v1 controllers (`cgroup` mounts naming `memory`, `cpu`), a v2 hierarchy
(`cgroup2`) whose `cgroup.controllers` lists what it manages, or both (hybrid: v1 memory/cpu plus an
otherwise empty v2 tree that still gives per-cgroup PSI).

Figures: memory limit (min over ancestors), usage, working set, anon/file, OOM kills, limit hits,
PSI, CPU quota and throttling; `read_memory`, `read_cpu`, `read_pressure`. A file that does not
exist is a figure this host lacks and is left out (None); a file that cannot be read is recorded in
the caller's `problems` list. Pure `parse_*` functions raise `ProbeError` on malformed content.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

from agent.core.errors import ProbeAccessDenied, ProbeError, ProbeUnavailable
from probes.linux.procfs import HOST_ROOT, proc_path, read_file, read_raw

# v1 reports "no limit" as the largest page-aligned long: 9223372036854771712 with 4 KiB pages, a
# little less with bigger pages. No real limit comes near 2**62 bytes (4 EiB).
V1_UNLIMITED_THRESHOLD = 2**62

Layout = Literal["v1", "v2", "hybrid", "none"]
T = TypeVar("T")


def _malformed(what: str, detail: str, data: bytes) -> ProbeError:
    preview = data[:80].decode("utf-8", "backslashreplace")
    return ProbeError(f"malformed {what}: {detail} (starting {preview!r}); is this a cgroup filesystem?")


def _int(value: bytes | str, what: str, data: bytes) -> int:
    try:
        return int(value)
    except ValueError:
        raise _malformed(what, f"{value[:40]!r} is not an integer", data) from None


# --------------------------------------------------------------------------- /proc/PID/cgroup


@dataclass(frozen=True, slots=True)
class CgroupMembership:
    """One line of `/proc/PID/cgroup`: `hierarchy-id:controllers:path` (v2 is `0::path`)."""

    hierarchy_id: int
    controllers: tuple[str, ...]  # ("memory",), ("cpu", "cpuacct"), ("name=systemd",), () for v2
    path: str


def parse_proc_cgroup(data: bytes) -> list[CgroupMembership]:
    what = "/proc/PID/cgroup"
    memberships = []
    for line in data.decode("utf-8", "surrogateescape").splitlines():
        if not line:
            continue
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            raise _malformed(what, f"line {line[:60]!r} is not 'id:controllers:/path'", data)
        controllers = tuple(c for c in parts[1].split(",") if c)
        memberships.append(CgroupMembership(_int(parts[0], what, data), controllers, parts[2]))
    if not memberships:
        raise _malformed(what, "no cgroup lines", data)
    return memberships


# --------------------------------------------------------------------------- /proc/self/mountinfo


@dataclass(frozen=True, slots=True)
class CgroupMount:
    """A mounted cgroup hierarchy: where (`mount_point`) and which subtree of it (`root`)."""

    mount_point: str
    root: str
    version: Literal[1, 2]
    controllers: tuple[str, ...]  # v1: from the super options; v2: () (see cgroup.controllers)


_MOUNTINFO_ESCAPE = re.compile(r"\\([0-7]{3})")
_V1_NON_CONTROLLER_OPTIONS = {"rw", "ro", "noprefix", "clone_children", "xattr", "cpuset_v2_mode"}


def _unescape(field: str) -> str:
    """Mountinfo escapes space, tab, newline and backslash as `\\ooo` octal."""
    return _MOUNTINFO_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(data: bytes) -> list[CgroupMount]:
    """The `cgroup` and `cgroup2` mounts of a mountinfo file (see proc(5) for the line format)."""
    what = "/proc/self/mountinfo"
    mounts = []
    for line in data.decode("utf-8", "surrogateescape").splitlines():
        if not line.strip():
            continue
        head, sep, tail = line.partition(" - ")
        fields, tail_fields = head.split(), tail.split()
        if not sep or len(fields) < 6 or len(tail_fields) < 2:
            raise _malformed(
                what, f"line {line[:60]!r} lacks the fields of 'id parent dev root point ... - fs'", data
            )
        fstype = tail_fields[0]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        root, mount_point = _unescape(fields[3]), _unescape(fields[4])
        if fstype == "cgroup2":
            mounts.append(CgroupMount(mount_point, root, 2, ()))
            continue
        options = tail_fields[2].split(",") if len(tail_fields) > 2 else []
        controllers = tuple(
            opt for opt in options if opt not in _V1_NON_CONTROLLER_OPTIONS and "=" not in opt
        )
        named = tuple(opt for opt in options if opt.startswith("name="))
        mounts.append(CgroupMount(mount_point, root, 1, controllers + named))
    return mounts


def cgroup_layout(mounts: list[CgroupMount]) -> Layout:
    has_v1 = any(m.version == 1 and not all(c.startswith("name=") for c in m.controllers) for m in mounts)
    has_v2 = any(m.version == 2 for m in mounts)
    if has_v1 and has_v2:
        return "hybrid"
    return "v1" if has_v1 else "v2" if has_v2 else "none"


def resolve_directory(mount: CgroupMount, cgroup_path: str) -> str | None:
    """The directory of `cgroup_path` under `mount`, or None when the mount does not contain it.

    `cgroup_path` is relative to the reader's cgroup namespace, like the mount's root; a path that
    climbs out of the namespace (`/../..`) cannot be reached from here.
    """
    if mount.root == "/":
        relative = cgroup_path
    elif cgroup_path == mount.root or cgroup_path.startswith(mount.root.rstrip("/") + "/"):
        relative = cgroup_path[len(mount.root) :]
    else:
        return None
    parts = [part for part in relative.split("/") if part]
    if ".." in parts:
        return None
    return "/".join([mount.mount_point.rstrip("/"), *parts]) or "/"


# --------------------------------------------------------------------------- locating a process


@dataclass(frozen=True, slots=True)
class ControllerDir:
    """Where one controller keeps a process's files; `top` bounds the walk over ancestors."""

    path: str  # already prefixed with the probe root
    top: str
    version: Literal[1, 2]


@dataclass(frozen=True, slots=True)
class CgroupLocation:
    layout: Layout
    memory: ControllerDir | None
    cpu: ControllerDir | None
    unified: ControllerDir | None  # the v2 directory, for PSI (also present on hybrid hosts)


def _prefixed(root: Path, path: str) -> str:
    base = str(root).rstrip("/")
    return base + path if base else path


def _v2_controllers(directory: str) -> set[str] | None:
    """Controllers the v2 hierarchy manages for this cgroup; None when unknown (then try its files)."""
    try:
        return set(read_file(directory + "/cgroup.controllers").decode("ascii", "replace").split())
    except ProbeError:
        return None


def find_directory(
    memberships: list[CgroupMembership],
    mounts: list[CgroupMount],
    version: Literal[1, 2],
    controller: str = "",
) -> tuple[str, str] | None:
    """(directory, mount point) of the v1 hierarchy holding `controller`, or of the v2 hierarchy."""
    for member in memberships:
        if (version == 1 and controller not in member.controllers) or (version == 2 and member.hierarchy_id):
            continue
        for mount in mounts:
            if mount.version != version or (version == 1 and controller not in mount.controllers):
                continue
            directory = resolve_directory(mount, member.path)
            if directory:
                return directory, mount.mount_point
    return None


def locate_cgroups(pid: int, root: Path = HOST_ROOT) -> CgroupLocation:
    """Each controller's directory for `pid`: v1 where a v1 hierarchy has the controller, else v2."""
    memberships = parse_proc_cgroup(read_file(proc_path(root, pid, "cgroup"), pid))
    mounts = parse_mountinfo(read_file(proc_path(root, "self", "mountinfo")))
    layout = cgroup_layout(mounts)
    if layout == "none":
        raise ProbeUnavailable(
            "no cgroup filesystem is mounted (see /proc/self/mountinfo): no cgroup figures"
        )

    def controller_dir(found: tuple[str, str] | None, version: Literal[1, 2]) -> ControllerDir | None:
        return ControllerDir(_prefixed(root, found[0]), _prefixed(root, found[1]), version) if found else None

    unified = controller_dir(find_directory(memberships, mounts, 2), 2)
    v2_controllers = _v2_controllers(unified.path) if unified else set()

    def pick(controller: str) -> ControllerDir | None:
        v1 = controller_dir(find_directory(memberships, mounts, 1, controller), 1)
        if v1 is None and unified is not None and (v2_controllers is None or controller in v2_controllers):
            return unified
        return v1

    return CgroupLocation(layout, pick("memory"), pick("cpu"), unified)


# --------------------------------------------------------------------------- file formats


def parse_int(data: bytes, what: str) -> int:
    """A file holding one integer (`memory.usage_in_bytes`, `memory.current`, `cpu.cfs_quota_us`)."""
    text = data.strip()
    if not text or b"\n" in text:
        raise _malformed(what, "expected one integer", data)
    return _int(text, what, data)


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
            raise _malformed(what, f"line {line[:60]!r} is not 'key value'", data)
        table[parts[0].decode("ascii", "replace")] = _int(parts[1], what, data)
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
        raise _malformed("memory.stat", "none of rss, cache, anon, file, inactive_file", data)
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
            raise _malformed(
                what, f"line {line[:60]!r} is not 'some|full avg10= avg60= avg300= total='", data
            )
        kind, avg10, avg60, avg300, total = match.groups()
        lines[kind] = PressureLine(float(avg10), float(avg60), float(avg300), int(total) / 1e6)
    if b"some" not in lines:
        raise _malformed(what, "no 'some' line", data)
    return Pressure(lines[b"some"], lines.get(b"full"))


@dataclass(frozen=True, slots=True)
class CpuQuota:
    quota_cores: float | None  # None: unlimited
    period_seconds: float


def parse_cpu_max(data: bytes) -> CpuQuota:
    """v2 `cpu.max`: `max 100000` or `<quota µs> <period µs>`."""
    parts = data.split()
    if len(parts) != 2:
        raise _malformed("cpu.max", "expected '<quota|max> <period>'", data)
    period = _int(parts[1], "cpu.max", data)
    if period <= 0:
        raise _malformed("cpu.max", "the period must be positive", data)
    if parts[0] == b"max":
        return CpuQuota(None, period / 1e6)
    return CpuQuota(_int(parts[0], "cpu.max", data) / period, period / 1e6)


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


def ancestors(directory: ControllerDir) -> list[str]:
    """The directory and its parents up to the mount point, included: inside a cgroup namespace the
    mounted directory is the container's own cgroup, with its own limit (the real root has none)."""
    top = directory.top.rstrip("/")
    chain, path = [], directory.path.rstrip("/")
    while path.startswith(top + "/"):
        chain.append(path)
        path = path.rsplit("/", 1)[0]
    return [*chain, top]


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
