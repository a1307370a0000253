"""The `pyhist` probe: Python type histograms and allocation sites through the in-process hook.

Every `histograms.python.interval` (default 5 min) it asks the hook for the top types of the objects
Python's garbage collector tracks, plus the keys and values of the largest dicts (count and shallow
`sys.getsizeof` bytes); the walk holds the GIL for at most `histograms.python.budget`, and the hook
refuses heaps too large to walk in time (`too_expensive`, recorded as a probe error).

Allocation sites: when a leak finding opens on the instance (`histograms.python.sites.on_leak`, the
collector calls `want_sites`), the probe starts the hook's tracemalloc session with the configured
frames and budgets, then takes a `sites` snapshot every `sites.interval` while the session runs
(whoever started it: `medic heap NAME --sites` too), stored as source `tracemalloc` (kind `site`), so
that the suspects ranking names the line that allocates what grows. The session stops itself in the
target when its time or memory budget runs out.

The native shim has neither op: for such targets the probe stays quiet, as it does without a hook
(the allocator probe already says how to add one).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import ClassVar

from agent.core.errors import ProbeError, ProbeUnavailable, TargetGone
from agent.core.figures import is_figure
from agent.core.histograms import HistogramRow, Snapshot, rows_from
from agent.core.records import ProbeResult, ProbeTarget, Sample
from native_hooks.client import HookClient
from native_hooks.errors import HookNotFound, HookOpUnavailable, HookRequestError
from native_hooks.sockets import namespace_pids
from probes.allocator import hook_socket_for
from probes.base import Schedule
from probes.linux.procfs import HOST_ROOT, proc_path
from probes.settings import PythonHistograms, PythonSites, settings_for

Key = tuple[str, int, float]
SITES_TIMEOUT = 10.0


class PythonHistogramProbe:
    name: ClassVar[str] = "pyhist"
    schedule: ClassVar[Schedule] = "slow"

    def __init__(self, root: Path = HOST_ROOT) -> None:
        self.root = root
        self._next: dict[Key, float] = {}  # when the next type histogram is due
        self._sites_next: dict[Key, float] = {}  # when the next sites snapshot is due
        self._start_sites: set[str] = set()  # instances whose tracing session should start
        self._no_sites: set[Key] = set()  # hooks without the sites ops (the native shim)
        self._lock = threading.Lock()

    def want_sites(self, instance: str) -> None:
        """Start allocation-site tracing on `instance` at its next collect (a leak finding opened)."""
        with self._lock:
            self._start_sites.add(instance)

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        settings = settings_for(target, "python", PythonHistograms)
        key = (target.instance, target.pid, target.start_time)
        with self._lock:
            histogram_due = now >= self._next.get(key, 0.0)
            start_sites = target.instance in self._start_sites and settings.sites.on_leak
            sites_due = key not in self._no_sites and (start_sites or now >= self._sites_next.get(key, 0.0))
        if not (histogram_due or sites_due):
            return ProbeResult()
        if not os.path.exists(proc_path(self.root, target.pid)):
            raise TargetGone(f"process {target.pid} of {target.instance} is gone")
        try:
            path = hook_socket_for(target, self.root)
        except HookNotFound:
            return ProbeResult()  # no hook: the allocator probe already says so and how to add one
        hook_timeout = float((target.settings.get("hook") or {}).get("timeout") or 1.0)
        # a sites snapshot at the default memory budget takes up to about 3 s (docs/performance.md)
        timeout = max(hook_timeout, settings.budget + 2.0, SITES_TIMEOUT if sites_due else 0.0)
        result = ProbeResult()
        with HookClient(path, timeout, pid=target.pid, root=self.root) as client:
            if sites_due:  # first: a histogram refused as too expensive must not cost the sites
                with self._lock:
                    self._sites_next[key] = now + settings.sites.interval
                    self._start_sites.discard(target.instance)
                self._sites(client, target, now, settings.sites, start_sites, result)
            if histogram_due:
                with self._lock:
                    self._next[key] = now + settings.interval  # a failed request waits its interval too
                try:
                    self._histogram(client, target, now, settings, path, result)
                except ProbeError as exc:
                    if not result.snapshots:
                        raise
                    result.problems.append(exc)  # the sites snapshot still counts
        return result

    def _histogram(
        self,
        client: HookClient,
        target: ProbeTarget,
        now: float,
        settings: PythonHistograms,
        path: str,
        result: ProbeResult,
    ) -> None:
        try:
            reply = client.request("histogram", top=settings.top, budget_s=settings.budget)
        except HookRequestError as exc:
            if exc.code == "unknown_op":
                return  # the native shim: no Python objects to count
            raise
        pid = reply.get("pid")
        if isinstance(pid, int) and pid not in namespace_pids(target.pid, self.root):
            raise ProbeUnavailable(
                f"hook at {path} belongs to pid {pid}, not to {target.instance}'s pid {target.pid}"
            )
        snapshot = snapshot_from_reply(target, now, reply)
        result.samples += [
            Sample(target.instance, "python_gc_objects", now, snapshot.total_count),
            Sample(target.instance, "python_gc_objects_bytes", now, snapshot.total_bytes),
        ]
        result.snapshots.append(snapshot)

    def _sites(
        self,
        client: HookClient,
        target: ProbeTarget,
        now: float,
        settings: PythonSites,
        start: bool,
        result: ProbeResult,
    ) -> None:
        """Start the session when asked, then one `sites` snapshot if the target is tracing."""
        key = (target.instance, target.pid, target.start_time)
        try:
            if start:
                client.request(
                    "sites_start",
                    frames=settings.frames,
                    duration_s=settings.duration,
                    max_memory=settings.max_memory,
                )
            reply = client.request("sites", top=settings.top)
        except HookOpUnavailable:
            return  # not tracing (never started, or stopped by its budget): nothing to read
        except HookRequestError as exc:
            if exc.code == "unknown_op":
                with self._lock:
                    self._no_sites.add(key)  # the native shim (or an older hook)
                return
            result.problems.append(exc)
            return
        result.snapshots.append(sites_snapshot_from_reply(target, now, reply))

    def forget(self, target: ProbeTarget) -> None:
        key = (target.instance, target.pid, target.start_time)
        with self._lock:
            self._next.pop(key, None)
            self._sites_next.pop(key, None)
            self._no_sites.discard(key)


def snapshot_from_reply(target: ProbeTarget, now: float, reply: dict) -> Snapshot:
    """A `python` snapshot from a `histogram` reply; malformed rows are skipped.

    Totals: the object count is the hook's; bytes are the sum over the returned (top) types.
    """
    rows = []
    for item in reply.get("types") or []:
        if not isinstance(item, dict):
            continue
        name, count, size = item.get("type"), item.get("count"), item.get("bytes")
        if isinstance(name, str) and is_figure(count) and is_figure(size):
            rows.append((name, float(count), float(size)))
    merged = rows_from(rows)
    objects = reply.get("objects")
    total_count = float(objects) if is_figure(objects) else sum(r.count for r in merged)
    distinct = reply.get("distinct_types")
    elapsed = reply.get("elapsed_s")
    containers = [
        {key: item.get(key) for key in ("type", "len", "bytes", "content_bytes", "holds", "complete")}
        for item in (reply.get("containers") or [])[:16]
        if isinstance(item, dict)
    ]
    meta = {
        "elapsed_s": elapsed if is_figure(elapsed) else None,
        "referents": reply.get("referents") is True,
        "containers": containers,
        "sites_tracing": reply.get("sites_tracing") is True,
        # the hook's budgets cut its count of the largest containers short: a partial figure
        "partial": reply.get("contents_complete") is False,
    }
    return Snapshot(
        target.instance,
        "python",
        now,
        merged,
        total_count,
        sum(r.bytes for r in merged),
        target.pid,
        target.start_time,
        int(distinct) if is_figure(distinct) else len(merged),
        meta,
    )


def sites_snapshot_from_reply(target: ProbeTarget, now: float, reply: dict) -> Snapshot:
    """A `tracemalloc` snapshot (kind `site`) from a `sites` reply: one row per `file:line`, with the
    heaviest call path to it (innermost first) as its detail; malformed rows are skipped."""
    rows = []
    for item in reply.get("sites") or []:
        if not isinstance(item, dict):
            continue
        name, count, size, stack = (
            item.get("site"),
            item.get("count"),
            item.get("bytes"),
            item.get("traceback"),
        )
        if not (isinstance(name, str) and is_figure(count) and is_figure(size)):
            continue
        frames = [f for f in stack if isinstance(f, str)] if isinstance(stack, list) else []
        rows.append(HistogramRow(name[:1000], float(count), float(size), " ← ".join(frames)[:2000] or None))
    total_bytes, total_count = reply.get("total_bytes"), reply.get("total_count")
    distinct = reply.get("distinct_sites")
    meta = {
        key: reply.get(key)
        for key in ("frames", "traced_bytes", "tracemalloc_bytes", "remaining_s", "elapsed_s", "owned")
        if is_figure(reply.get(key)) or isinstance(reply.get(key), bool)
    }
    return Snapshot(
        target.instance,
        "tracemalloc",
        now,
        rows,
        float(total_count) if is_figure(total_count) else sum(r.count for r in rows),
        float(total_bytes) if is_figure(total_bytes) else sum(r.bytes for r in rows),
        target.pid,
        target.start_time,
        int(distinct) if is_figure(distinct) else len(rows),
        meta,
    )
