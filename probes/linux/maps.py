"""`/proc/PID/maps`: the memory map of a process, as one `Mapping` record per line.

The same lines appear in heap-profile dumps (`MAPPED_LIBRARIES:`, a copy of `/proc/self/maps`), so
the line parser is public: `parse_maps_line` returns None for a line that is not one, `parse_maps`
raises `ProbeError` naming the first such line. A path keeps what the kernel printed, spaces and a
` (deleted)` suffix included; the kernel escapes a newline in a path as `\\012`, so lines split on `\\n`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agent.core.errors import ProbeError
from agent.core.figures import FIGURE_LIMIT
from probes.linux.procfs import HOST_ROOT, proc_path, read_file

_LINE = re.compile(
    r"([0-9a-fA-F]{1,16})-([0-9a-fA-F]{1,16})\s+([-rwxsp]{4})\s+([0-9a-fA-F]{1,16})\s+(\S+)\s+(\d{1,20})"
    r"(?:\s+(.*))?",
    re.ASCII,
)
_DELETED = " (deleted)"


@dataclass(frozen=True, slots=True)
class Mapping:
    """One line of `/proc/PID/maps`: `start-end perms offset dev inode path`."""

    start: int
    end: int
    perms: str
    offset: int
    path: str  # "" for anonymous mappings; `[heap]`, `[stack]`, `[vdso]` for the kernel's own
    inode: int = 0  # 0 for anonymous mappings
    dev: str = ""  # `major:minor` in hex

    @property
    def executable(self) -> bool:
        return "x" in self.perms

    @property
    def deleted(self) -> bool:
        """The mapped file was unlinked (or replaced) after it was mapped."""
        return self.path.endswith(_DELETED)


def parse_maps_line(line: str) -> Mapping | None:
    """One maps line (a trailing newline allowed), or None if it is not one."""
    match = _LINE.fullmatch(line.rstrip("\n"))
    if match is None:
        return None
    start, end = int(match.group(1), 16), int(match.group(2), 16)
    if end < start:
        return None
    return Mapping(
        start=start,
        end=end,
        perms=match.group(3),
        offset=int(match.group(4), 16),
        path=match.group(7) or "",
        inode=int(match.group(6)),
        dev=match.group(5),
    )


def parse_maps(data: bytes) -> list[Mapping]:
    """Every line of a maps file; `ProbeError` naming the first line that is not in the kernel's format.

    Paths are decoded like the rest of the file system (`os.fsdecode`), so odd bytes survive.
    """
    mappings = []
    for number, line in enumerate(os.fsdecode(data).split("\n"), 1):
        if not line.strip():
            continue
        mapping = parse_maps_line(line)
        if mapping is None:
            raise ProbeError(f"/proc/PID/maps line {number} is not in the kernel's format: {line[:120]!r}")
        mappings.append(mapping)
    return mappings


def read_maps(pid: int, root: Path = HOST_ROOT) -> list[Mapping]:
    """The memory map of a live process (needs ptrace-read access: the same uid, or root)."""
    return parse_maps(read_file(proc_path(root, pid, "maps"), pid))


# --------------------------------------------------------------------------- /proc/PID/smaps
_SMAPS_HEAD = re.compile(rb"([0-9a-fA-F]{1,16})-([0-9a-fA-F]{1,16}) ")
_SMAPS_RSS = re.compile(rb"Rss:\s+(\d{1,20}) kB")


def parse_smaps_resident(data: bytes) -> list[tuple[int, int, int]]:
    """(start, end, resident bytes) of each mapping of `/proc/PID/smaps` (a maps line, then `Key: N kB`
    lines, of which `Rss` is kept); `ProbeError` when an `Rss` line has no mapping before it."""
    regions: list[tuple[int, int, int]] = []
    span: tuple[int, int] | None = None
    for line in data.split(b"\n"):
        if head := _SMAPS_HEAD.match(line):
            span = int(head.group(1), 16), int(head.group(2), 16)
        elif rss := _SMAPS_RSS.fullmatch(line.rstrip()):
            if span is None:
                raise ProbeError("/proc/PID/smaps: an Rss line before any mapping: not an smaps file")
            size = int(rss.group(1)) * 1024
            if size >= FIGURE_LIMIT:
                raise ProbeError(
                    f"/proc/PID/smaps: an Rss of {rss.group(1).decode()} kB is wider than 64 bits"
                )
            regions.append((*span, size))
            span = None
    return regions


def resident_within(pid: int, start: int, end: int, root: Path = HOST_ROOT) -> tuple[int, int]:
    """(bytes resident in the mappings that overlap [start, end), bytes resident in all of them) of a
    live process: what part of its RSS one address range holds (a JVM's heap), from one smaps read."""
    regions = parse_smaps_resident(read_file(proc_path(root, pid, "smaps"), pid))
    inside = sum(rss for low, high, rss in regions if low < end and high > start)
    return inside, sum(rss for _, _, rss in regions)
