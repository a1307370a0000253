"""Allocator figures of a target, read through its hook socket (in-process Python hook or LD_PRELOAD shim).

The socket is the instance's `hook.socket` setting when configured (a `%p` in it becomes the pid), else
the one found by convention (`native_hooks.sockets.find_socket`). Figures map to the same names for
every allocator (docs/allocators.md); figures an allocator lacks are not emitted. No hook means
`ProbeUnavailable` with the way to get one.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from agent.core.errors import ProbeUnavailable, TargetGone
from agent.core.figures import is_figure
from agent.core.records import ProbeResult, ProbeTarget, Sample
from native_hooks.client import HookClient
from native_hooks.errors import HOOK_HOWTO, HookNotFound
from native_hooks.sockets import find_socket, namespace_pids, remove_if_stale
from probes.base import Schedule
from probes.linux.procfs import HOST_ROOT, proc_path

LEFTOVER_PATIENCE = 60.0  # seconds a gone process's socket is tried again (past STALE_GRACE_SECONDS)

# hook figure -> metric (agent/core/catalog.py, source "allocator")
FIGURE_METRICS = {
    "allocated": "allocator_allocated_bytes",
    "active": "allocator_active_bytes",
    "resident": "allocator_resident_bytes",
    "mapped": "allocator_mapped_bytes",
    "retained": "allocator_retained_bytes",
    "metadata": "allocator_metadata_bytes",
    "free": "allocator_free_bytes",
    "purgeable": "allocator_purgeable_bytes",
}


def hook_socket_for(target: ProbeTarget, root: Path = HOST_ROOT) -> str:
    """The hook socket of `target`; raises `HookNotFound` saying how to get one."""
    configured = (target.settings.get("hook") or {}).get("socket")
    if configured:
        return str(configured).replace("%p", str(target.pid))
    found = find_socket(target.pid, root)
    if found is None:
        raise HookNotFound(f"no allocator hook for pid {target.pid} ({target.instance}): {HOOK_HOWTO}")
    return found


class AllocatorProbe:
    name: ClassVar[str] = "allocator"
    schedule: ClassVar[Schedule] = "fast"

    def __init__(self, timeout: float = 1.0, root: Path = HOST_ROOT) -> None:
        self.timeout = timeout
        self.root = root
        self._sockets: dict[tuple[str, int, float], str] = {}  # the socket each process answered on
        self._leftovers: dict[str, tuple[int, float]] = {}  # socket of a gone process -> (pid, since)
        self._lock = threading.Lock()

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        self._sweep_leftovers()
        if not os.path.exists(proc_path(self.root, target.pid)):
            raise TargetGone(f"process {target.pid} of {target.instance} is gone")
        path = hook_socket_for(target, self.root)
        timeout = (target.settings.get("hook") or {}).get("timeout") or self.timeout
        with HookClient(path, timeout, pid=target.pid, root=self.root) as client:
            reply = client.request("stats")
        pid = reply.get("pid")
        if isinstance(pid, int) and pid not in namespace_pids(target.pid, self.root):
            raise ProbeUnavailable(
                f"hook at {path} belongs to pid {pid}, not to {target.instance}'s pid {target.pid}: "
                "put %p in the socket path so that each process gets its own"
            )
        with self._lock:
            self._sockets[(target.instance, target.pid, target.start_time)] = path
        if not os.path.exists(proc_path(self.root, target.pid)):
            self.forget(target)  # it died after answering, maybe forgotten already by another thread
        return ProbeResult(samples=samples_from_stats(target.instance, now, reply))

    def forget(self, target: ProbeTarget) -> None:
        """The process is gone or was replaced: remove the socket it answered on if nobody listens there
        any more (a target stopped by TERM or KILL leaves its socket behind); one that cannot be removed
        yet (an unreaped zombie's young socket) is tried again at the next collections."""
        with self._lock:
            path = self._sockets.pop((target.instance, target.pid, target.start_time), None)
        if path is None or self.root != HOST_ROOT or remove_if_stale(path, target.pid):
            return
        if os.path.lexists(path):  # a zombie not reaped yet, or a socket too young to judge
            with self._lock:
                self._leftovers[path] = (target.pid, time.time())

    def _sweep_leftovers(self) -> None:
        """Try again the sockets `forget` could not remove yet; each is dropped once removed, gone, or
        after `LEFTOVER_PATIENCE` (by then `remove_if_stale` takes any socket nobody listens on)."""
        if not self._leftovers:  # the usual case, on every collection: no lock taken
            return
        with self._lock:
            leftovers = list(self._leftovers.items())
        now = time.time()
        for path, (pid, since) in leftovers:
            if (
                remove_if_stale(path, pid, now)
                or not os.path.lexists(path)
                or now - since > LEFTOVER_PATIENCE
            ):
                with self._lock:
                    self._leftovers.pop(path, None)


def samples_from_stats(instance: str, now: float, reply: Mapping[str, Any]) -> list[Sample]:
    """Samples from a hook `stats` reply; non-numeric or missing figures are skipped."""
    figures: Mapping[str, Any] = found if isinstance(found := reply.get("figures"), dict) else {}
    samples = [
        Sample(instance, metric, now, float(figures[key]))
        for key, metric in FIGURE_METRICS.items()
        if is_figure(figures.get(key))  # a figure past 2**63 would overflow the float and SQLite
    ]
    allocated, resident = figures.get("allocated"), figures.get("resident")
    if is_figure(allocated) and is_figure(resident) and allocated > 0:
        samples.append(
            Sample(instance, "allocator_fragmentation_ratio", now, float(resident) / float(allocated))
        )
    python: Mapping[str, Any] = found if isinstance(found := reply.get("python"), dict) else {}
    blocks = python.get("pymalloc_allocated_blocks")
    if isinstance(blocks, int) and is_figure(blocks):
        samples.append(Sample(instance, "pymalloc_allocated_blocks", now, float(blocks)))
    return samples
