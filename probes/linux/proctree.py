"""Which processes descend from which: one pass over `/proc/*/stat`, then pure walks over it.

A worker-based server (gunicorn, uvicorn `--workers`, MLServer, TorchServe) serves from child
processes; medic follows them as part of their server's instance. The kernel's
`/proc/PID/task/TID/children` is missing on kernels built without `CONFIG_PROC_CHILDREN`, so the
tree is read from each process's parent pid instead: one `stat` read per process (about 10 µs each),
once per tick for every instance together. A process that exits during the pass is simply absent;
a zombie counts as gone, as everywhere in medic.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.core.errors import ProbeError
from agent.core.records import ProcessIdentity
from probes.linux.procfs import HOST_ROOT, parse_stat, proc_path, read_raw, same_process, start_time

# a pid namespace holds at most 4 Mi pids; a pass over more entries than this stops there (bounded work)
MAX_SCANNED = 1 << 16


@dataclass(frozen=True, slots=True)
class TreeEntry:
    """One live process as the pass saw it: who its parent is, and its identity."""

    pid: int
    ppid: int
    start_time: float
    comm: str

    @property
    def identity(self) -> ProcessIdentity:
        return ProcessIdentity(self.pid, self.start_time)


@dataclass(frozen=True, slots=True)
class ProcessTable:
    """Every live process at one instant, by pid, and the children of each."""

    entries: Mapping[int, TreeEntry]
    children: Mapping[int, tuple[int, ...]]

    def descendants(
        self, pid: int, limit: int, skip: Collection[int] = (), met: list[int] | None = None
    ) -> tuple[list[TreeEntry], int]:
        """The processes below `pid`, nearest first, at most `limit`; and how many more there were.

        A pid in `skip` (the process of another instance) is left out with everything below it, and
        appended to `met` when given."""
        found: list[TreeEntry] = []
        beyond = 0
        queue = deque(self.children.get(pid, ()))
        seen = {pid}
        while queue:
            child = queue.popleft()
            if child in seen:
                continue
            if child in skip:
                if met is not None:
                    met.append(child)
                continue
            seen.add(child)
            if len(found) < limit:
                found.append(self.entries[child])
            else:
                beyond += 1
            queue.extend(self.children.get(child, ()))
        return found, beyond

    def ancestors(self, pid: int) -> list[int]:
        """The parent, grandparent, ... of `pid` up to the top of the pid namespace (bounded by the table)."""
        chain: list[int] = []
        entry = self.entries.get(pid)
        while (
            entry is not None
            and entry.ppid > 0
            and entry.ppid not in chain
            and len(chain) < len(self.entries)
        ):
            chain.append(entry.ppid)
            entry = self.entries.get(entry.ppid)
        return chain

    def alive(self, identity: ProcessIdentity) -> bool:
        """Whether `identity` runs still (its pid is present with the same start time)."""
        entry = self.entries.get(identity.pid)
        return entry is not None and same_process(entry.start_time, identity.start_time)


def build_table(entries: Iterable[TreeEntry]) -> ProcessTable:
    """The table of `entries`, with each parent's children in pid order."""
    by_pid = {entry.pid: entry for entry in entries}
    children: dict[int, list[int]] = {}
    for entry in by_pid.values():
        if entry.ppid in by_pid:
            children.setdefault(entry.ppid, []).append(entry.pid)
    return ProcessTable(by_pid, {pid: tuple(sorted(kids)) for pid, kids in children.items()})


def read_process_table(root: Path = HOST_ROOT) -> ProcessTable:
    """Every live process under `root`'s /proc (zombies and processes that exit meanwhile left out)."""
    base = proc_path(root)
    entries: list[TreeEntry] = []
    try:
        names = os.listdir(base)
    except OSError as exc:
        raise ProbeError(f"cannot list {base}: {exc.strerror}; is /proc mounted?") from None
    for name in names[:MAX_SCANNED]:
        if not name.isdigit():
            continue
        try:
            stat = parse_stat(read_raw(f"{base}/{name}/stat"))
        except (OSError, ProbeError):
            continue  # exited between the listing and the read, or not a process we can read
        if stat.state in ("Z", "X"):
            continue
        entries.append(TreeEntry(stat.pid, stat.ppid, start_time(stat, root), stat.comm))
    return build_table(entries)


def describe(pid: int, comm: str = "", root: Path = HOST_ROOT, width: int = 160) -> str:
    """A process's command line for people, from the first 4 KiB of `/proc/PID/cmdline` (a
    command line of any size costs one bounded read), cut to `width`; its `comm` when unreadable."""
    try:
        fd = os.open(proc_path(root, pid, "cmdline"), os.O_RDONLY | os.O_CLOEXEC)
        try:
            head = os.read(fd, 4096)
        finally:
            os.close(fd)
    except OSError:
        head = b""
    text = head.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace").strip()
    text = text or f"[{comm or pid}]"
    return text if len(text) <= width else text[: width - 1] + "…"
