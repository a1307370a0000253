"""Where a process's cgroups are, on v1, v2 and hybrid hosts.

`/proc/PID/cgroup` says which cgroup a process is in, per hierarchy; `/proc/self/mountinfo` says where
each hierarchy is mounted (and which part of it: the mount root, which differs from `/` inside
containers). Together they give each controller's directory (`locate_cgroups`). The layout is
detected at run time: v1 controllers (`cgroup` mounts naming `memory`, `cpu`), a v2 hierarchy
(`cgroup2`) whose `cgroup.controllers` lists what it manages, or both (hybrid: v1 memory/cpu plus an
otherwise empty v2 tree that still gives per-cgroup PSI). What the directories hold is read by
`probes.linux.cgroupfiles`. Pure `parse_*` functions raise `ProbeError` on malformed content.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent.core.errors import ProbeError, ProbeUnavailable
from probes.linux.procfs import HOST_ROOT, proc_path, read_file

Layout = Literal["v1", "v2", "hybrid", "none"]


def malformed(what: str, detail: str, data: bytes) -> ProbeError:
    """The error for a cgroup or /proc file whose content is not what the kernel writes."""
    preview = data[:80].decode("utf-8", "backslashreplace")
    return ProbeError(f"malformed {what}: {detail} (starting {preview!r}); is this a cgroup filesystem?")


def to_int(value: bytes | str, what: str, data: bytes) -> int:
    """`value`, a field of the file `what` holding `data`, as an integer; `malformed` if it is not one."""
    try:
        return int(value)
    except ValueError:
        raise malformed(what, f"{value[:40]!r} is not an integer", data) from None


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
            raise malformed(what, f"line {line[:60]!r} is not 'id:controllers:/path'", data)
        controllers = tuple(c for c in parts[1].split(",") if c)
        memberships.append(CgroupMembership(to_int(parts[0], what, data), controllers, parts[2]))
    if not memberships:
        raise malformed(what, "no cgroup lines", data)
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
            raise malformed(
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


_mounts: dict[str, tuple[bytes, list[CgroupMount]]] = {}  # root → the last mountinfo read, parsed


def cgroup_mounts(root: Path = HOST_ROOT) -> list[CgroupMount]:
    """The cgroup mounts of medic's mount namespace, parsed again only when mountinfo changed (every
    process is located every minute, and a host's mountinfo can run to hundreds of lines)."""
    data = read_file(proc_path(root, "self", "mountinfo"))
    last = _mounts.get(str(root))
    if last is not None and last[0] == data:
        return last[1]
    mounts = parse_mountinfo(data)
    _mounts[str(root)] = (data, mounts)
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
    mounts = cgroup_mounts(root)
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


def ancestors(directory: ControllerDir) -> list[str]:
    """The directory and its parents up to the mount point, included: inside a cgroup namespace the
    mounted directory is the container's own cgroup, with its own limit (the real root has none)."""
    top = directory.top.rstrip("/")
    chain, path = [], directory.path.rstrip("/")
    while path.startswith(top + "/"):
        chain.append(path)
        path = path.rsplit("/", 1)[0]
    return [*chain, top]
