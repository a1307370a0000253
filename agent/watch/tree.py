"""The processes of one instance: its own (the server) and the workers descended from it.

A worker-based server (gunicorn, uvicorn `--workers`, MLServer, TorchServe, Triton's Python backend)
serves from child processes. The instance is the tree: each member is known by its identity (pid +
start time), role (`server`, `worker`) and command, with its last figures and a short history of its
memory, so that a finding on the instance can name the member that grows.

The instance's memory (`tree_memory_bytes`, the figure the memory detectors judge):

- `cgroup`: the working set of the instance's cgroup, when the instance owns it (every process in
  it belongs to the tree, and it has no child cgroups): what the kernel charges against the limit;
- `pss`: with workers, the sum of each process's RSS less the shared pages its last PSS reading
  found (`rss - pss`), so that a copy-on-write page shared by a server and its workers counts once,
  while a worker's new private growth shows at once;
- `rss`: one process alone: its RSS, as before there were trees.

A figure missing for a member this tick (unreadable, or exited meanwhile) means no instance figure
this tick: a partial sum would read as a drop, and nothing is judged on it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from agent.core.errors import ProbeError
from agent.core.records import ProbeResult, ProcessIdentity, Sample
from probes.linux.cgroupfiles import cgroup_members
from probes.linux.cgroupfs import ControllerDir, locate_cgroups
from probes.linux.procfs import HOST_ROOT
from probes.process import add_workers
from probes.smaps import read_pss

T = TypeVar("T")
Role = Literal["server", "worker"]
Source = Literal["cgroup", "pss", "rss"]
HISTORY_POINTS = 256  # memory points kept per member; the spacing doubles when full (any lifetime fits)
FIRST_STEP = 1.0  # seconds between kept points until the history first fills
FIRST_PSS_PER_TICK = 8  # new processes whose PSS is read at first sight, per instance and tick


@dataclass(slots=True)
class Member:
    """One process of the instance, its latest figures and a bounded history of its memory."""

    identity: ProcessIdentity
    role: Role
    parent: int
    command: str
    first_seen: float
    rss: float | None = None
    cpu_seconds: float | None = None
    pss: float | None = None
    uss: float | None = None
    shared: float | None = None  # rss - pss at the last PSS reading: pages it shares with others
    pss_tried: bool = False  # its PSS was asked for at first sight (`first_pss`)
    seen_at: float | None = None  # the tick of `rss`
    history: list[tuple[float, float]] = field(default_factory=list)
    step: float = FIRST_STEP

    @property
    def memory(self) -> float | None:
        """Its share of the instance's memory: RSS less the pages it shares (when a PSS reading knows them)."""
        if self.rss is None:
            return None
        return max(0.0, self.rss - (self.shared or 0.0))

    def observe(self, now: float, figures: dict[str, float]) -> None:
        if "rss_bytes" in figures:
            self.rss, self.seen_at = figures["rss_bytes"], now
            self.cpu_seconds = figures.get("cpu_seconds_total", self.cpu_seconds)
        if "pss_bytes" in figures:
            self.pss, self.uss = figures["pss_bytes"], figures.get("uss_bytes")
            if self.rss is not None:
                self.shared = max(0.0, self.rss - self.pss)
        memory = self.memory
        if memory is not None and "rss_bytes" in figures:
            self._keep(now, memory)

    def _keep(self, now: float, memory: float) -> None:
        if self.history and now - self.history[-1][0] < self.step:
            return
        self.history.append((now, memory))
        if len(self.history) >= HISTORY_POINTS:
            self.history = self.history[::2]
            self.step *= 2

    def growth(self, since: float, now: float) -> tuple[float, float] | None:
        """(bytes, bytes per second) its memory grew over [since, now], from the lowest points of the
        first and the last quarter of the span (a sawtooth's troughs); None with under four points."""
        points = [(ts, value) for ts, value in self.history if since <= ts <= now]
        if len(points) < 4:
            return None
        quarter = max(1, len(points) // 4)
        early, late = points[:quarter], points[-quarter:]
        t0 = sum(ts for ts, _ in early) / len(early)
        t1 = sum(ts for ts, _ in late) / len(late)
        grown = min(v for _, v in late) - min(v for _, v in early)
        return (grown, grown / (t1 - t0)) if t1 > t0 else None

    def to_dict(self, now: float) -> dict[str, Any]:
        return {
            "pid": self.identity.pid,
            "start_time": self.identity.start_time,
            "role": self.role,
            "parent": self.parent,
            "command": self.command,
            "age_seconds": max(0.0, now - self.identity.start_time),
            "rss_bytes": self.rss,
            "pss_bytes": self.pss,
            "uss_bytes": self.uss,
            "memory_bytes": self.memory,
            "cpu_seconds_total": self.cpu_seconds,
        }


@dataclass(slots=True)
class ProcessTree:
    """The members of one instance, kept current by the tracker and filled with figures by the collector."""

    members: dict[ProcessIdentity, Member] = field(default_factory=dict)
    source: Source | None = None
    worker_restarts: int = 0  # workers that ended while the server ran on
    capped: int = 0  # descendants beyond `match.max_children`, not followed, as of the last refresh
    refreshed: bool = False  # its workers were looked for since its server was attached

    @property
    def workers(self) -> tuple[ProcessIdentity, ...]:
        return tuple(m.identity for m in self.members.values() if m.role == "worker")

    def reset(self, server: ProcessIdentity | None, command: str = "", now: float = 0.0) -> None:
        """A new server (or none): the old members are forgotten."""
        self.members.clear()
        self.source = None
        self.refreshed = False
        if server is not None:
            self.members[server] = Member(server, "server", 0, command, now)

    def update(
        self, workers: Iterable[tuple[ProcessIdentity, int, T]], now: float, describe: Callable[[T], str]
    ) -> tuple[list[Member], list[Member]]:
        """Make the workers (identity, parent pid, what `describe` turns into its command line, read
        for a new one only) the current ones; returns (started, ended)."""
        current = {identity: (parent, item) for identity, parent, item in workers}
        ended = [m for i, m in self.members.items() if m.role == "worker" and i not in current]
        for member in ended:
            del self.members[member.identity]
        started = []
        for identity, (parent, item) in current.items():
            if identity not in self.members:
                member = Member(identity, "worker", parent, describe(item), now)
                self.members[identity] = member
                started.append(member)
        return started, ended

    def observe(self, now: float, processes: dict[ProcessIdentity, dict[str, float]]) -> None:
        for identity, figures in processes.items():
            member = self.members.get(identity)
            if member is not None:
                member.observe(now, figures)

    def samples(self, instance: str, now: float, cgroup_working_set: float | None) -> list[Sample]:
        """The instance's `tree_*` figures of the tick `now` (see the module's docstring)."""
        members = list(self.members.values())
        if not members:
            return []
        out = [Sample(instance, "tree_processes", now, float(len(members)))]
        fresh = [m for m in members if m.seen_at == now and m.rss is not None]
        if len(fresh) == len(members):
            out.append(Sample(instance, "tree_rss_bytes", now, math.fsum(m.rss or 0.0 for m in fresh)))
        memory: float | None = None
        if cgroup_working_set is not None:
            memory, self.source = cgroup_working_set, "cgroup"
        elif len(members) == 1 and fresh:
            memory, self.source = fresh[0].rss, "rss"  # one process: its RSS, as the detectors always judged
        elif len(fresh) == len(members):
            memory, self.source = math.fsum(m.memory or 0.0 for m in fresh), "pss"
        if memory is not None:
            out.append(Sample(instance, "tree_memory_bytes", now, memory))
        return out

    def pss_sample(
        self, instance: str, now: float, processes: dict[ProcessIdentity, dict[str, float]]
    ) -> list[Sample]:
        """`tree_pss_bytes` when the slow run read every member's PSS."""
        if not self.members or any("pss_bytes" not in processes.get(i, {}) for i in self.members):
            return []
        return [
            Sample(
                instance, "tree_pss_bytes", now, math.fsum(processes[i]["pss_bytes"] for i in self.members)
            )
        ]

    def unmeasured(self, limit: int = FIRST_PSS_PER_TICK) -> list[ProcessIdentity]:
        """Members of a tree of several processes never asked for their PSS, at most `limit` (each is
        asked once here; the `smaps` probe reads them all again on the slow schedule)."""
        if len(self.members) < 2:
            return []
        fresh = [m for m in self.members.values() if not m.pss_tried][:limit]
        for member in fresh:
            member.pss_tried = True
        return [m.identity for m in fresh]

    def cause(self, since: float, now: float) -> dict[str, Any] | None:
        """The member whose memory grew most over [since, now], with its growth: what a finding names."""
        grown = []
        for member in self.members.values():
            growth = member.growth(max(since, member.first_seen), now)
            if growth is not None:
                grown.append((growth[0], growth[1], member))
        if not grown:
            return None
        total = math.fsum(g for g, _, _ in grown if g > 0)
        bytes_, rate, member = max(grown, key=lambda item: item[0])
        if bytes_ <= 0:
            return None
        return {
            "pid": member.identity.pid,
            "start_time": member.identity.start_time,
            "role": member.role,
            "command": member.command,
            "growth_bytes": bytes_,
            "growth_bytes_per_hour": rate * 3600.0,
            "share": bytes_ / total if total > 0 else None,
            "processes": len(self.members),
        }

    def to_list(self, now: float) -> list[dict[str, Any]]:
        ordered = sorted(self.members.values(), key=lambda m: (m.role != "server", m.identity.pid))
        return [m.to_dict(now) for m in ordered]


def first_pss(
    identities: Iterable[ProcessIdentity], root: Path = HOST_ROOT
) -> dict[ProcessIdentity, dict[str, float]]:
    """PSS of processes seen for the first time, so that a new worker's shared pages are not counted
    again until the next slow run (a `smaps_rollup` read costs about 11 ms per GiB of RSS). One that
    cannot be read is simply left out: the `smaps` probe says so if it persists."""
    result = ProbeResult()
    add_workers(result, identities, lambda process: read_pss(process, root))
    return result.processes


class CgroupOwnership:
    """Whether an instance owns its memory cgroup: every process in it is one of the instance's (and it
    has no child cgroups). Then the cgroup's figures are the instance's own. Where the cgroup is, is
    looked up again every `RELOCATE_AFTER` seconds; who is in it, every tick (one small read, shared
    by the instances in the same cgroup)."""

    RELOCATE_AFTER = 60.0

    def __init__(self, root: Path = HOST_ROOT) -> None:
        self.root = root
        self._where: dict[ProcessIdentity, tuple[float, ControllerDir | None]] = {}
        # who is in each cgroup at the tick `_tick`: instances that share a cgroup read it once a tick
        self._tick: float | None = None
        self._inside: dict[tuple[str, int], tuple[int, ...] | None] = {}

    def owns(self, server: ProcessIdentity, members: Iterable[ProcessIdentity], now: float) -> bool:
        pids = {m.pid for m in members}
        found = self._where.get(server)
        if found is None or not 0 <= now - found[0] < self.RELOCATE_AFTER:
            try:
                memory = locate_cgroups(server.pid, self.root).memory
            except ProbeError:
                memory = None
            if len(self._where) > 4096:
                self._where.clear()
            found = self._where[server] = (now, memory)
        directory = found[1]
        if directory is None:
            return False
        if self._tick != now:
            self._tick, self._inside = now, {}
        key = (directory.path, len(pids))
        if key not in self._inside:
            self._inside[key] = cgroup_members(directory, len(pids))
        inside = self._inside[key]
        return inside is not None and bool(inside) and set(inside) <= pids

    def forget(self, server: ProcessIdentity) -> None:
        self._where.pop(server, None)
