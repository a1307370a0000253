"""The `pyhist` probe: Python type histograms through the in-process hook's `histogram` op.

Every `histograms.python.interval` (default 5 min) it asks the hook for the top types of the objects
Python's garbage collector tracks (count and shallow `sys.getsizeof` bytes); the walk holds the GIL
for at most `histograms.python.budget`, and the hook refuses heaps too large to walk in time
(`too_expensive`, recorded as a probe error). The native shim has no `histogram` op: for such targets
the probe stays quiet, as it does without a hook (the allocator probe already says how to add one).
The hook does not offer tracemalloc sites (yet).
"""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import ClassVar

from agent.core.errors import ProbeUnavailable, TargetGone
from agent.core.histograms import Snapshot, rows_from
from agent.core.records import ProbeResult, ProbeTarget, Sample
from native_hooks.client import HookClient
from native_hooks.errors import HookNotFound, HookRequestError
from native_hooks.sockets import namespace_pids
from probes.allocator import hook_socket_for
from probes.base import Schedule
from probes.linux.procfs import HOST_ROOT, proc_path
from probes.settings import PythonHistograms, settings_for


class PythonHistogramProbe:
    name: ClassVar[str] = "pyhist"
    schedule: ClassVar[Schedule] = "slow"

    def __init__(self, root: Path = HOST_ROOT) -> None:
        self.root = root
        self._next: dict[tuple[str, int, float], float] = {}
        self._lock = threading.Lock()

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        settings = settings_for(target, "python", PythonHistograms)
        key = (target.instance, target.pid, target.start_time)
        with self._lock:
            if now < self._next.get(key, 0.0):
                return ProbeResult()
        if not os.path.exists(proc_path(self.root, target.pid)):
            raise TargetGone(f"process {target.pid} of {target.instance} is gone")
        try:
            path = hook_socket_for(target, self.root)
        except HookNotFound:
            return ProbeResult()  # no hook: the allocator probe already says so and how to add one
        hook_timeout = float((target.settings.get("hook") or {}).get("timeout") or 1.0)
        with self._lock:
            self._next[key] = now + settings.interval  # a failed request waits its interval too
        try:
            with HookClient(
                path, max(hook_timeout, settings.budget + 2.0), pid=target.pid, root=self.root
            ) as client:
                reply = client.request("histogram", top=settings.top, budget_s=settings.budget)
        except HookRequestError as exc:
            if exc.code == "unknown_op":
                return ProbeResult()  # the native shim: no Python objects to count
            raise
        pid = reply.get("pid")
        if isinstance(pid, int) and pid not in namespace_pids(target.pid, self.root):
            raise ProbeUnavailable(
                f"hook at {path} belongs to pid {pid}, not to {target.instance}'s pid {target.pid}"
            )
        snapshot = snapshot_from_reply(target, now, reply)
        return ProbeResult(
            samples=[
                Sample(target.instance, "python_gc_objects", now, snapshot.total_count),
                Sample(target.instance, "python_gc_objects_bytes", now, snapshot.total_bytes),
            ],
            snapshots=[snapshot],
        )

    def forget(self, target: ProbeTarget) -> None:
        with self._lock:
            self._next.pop((target.instance, target.pid, target.start_time), None)


def snapshot_from_reply(target: ProbeTarget, now: float, reply: dict) -> Snapshot:
    """A `python` snapshot from a `histogram` reply; malformed rows are skipped.

    Totals: the object count is the hook's; bytes are the sum over the returned (top) types.
    """
    rows = []
    for item in reply.get("types") or []:
        if not isinstance(item, dict):
            continue
        name, count, size = item.get("type"), item.get("count"), item.get("bytes")
        if isinstance(name, str) and _number(count) and _number(size):
            rows.append((name, float(count), float(size)))
    merged = rows_from(rows)
    objects = reply.get("objects")
    total_count = float(objects) if _number(objects) else sum(r.count for r in merged)
    distinct = reply.get("distinct_types")
    elapsed = reply.get("elapsed_s")
    meta = {"elapsed_s": elapsed if _number(elapsed) else None, "referents": reply.get("referents") is True}
    return Snapshot(
        target.instance,
        "python",
        now,
        merged,
        total_count,
        sum(r.bytes for r in merged),
        target.pid,
        target.start_time,
        int(distinct) if _number(distinct) else len(merged),
        meta,
    )


def _number(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )
