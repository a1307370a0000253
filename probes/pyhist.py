"""The `pyhist` probe: Python type histograms, named containers and allocation sites through the
in-process hook.

Every `histograms.python.interval` (default 5 min) it asks the hook for the top types of the objects
Python's garbage collector tracks, plus what the longest containers hold (count and shallow
`sys.getsizeof` bytes). The walk stays within `histograms.python.budget` of the target's CPU: a heap
too large to walk whole is sampled (docs/histograms.md). The containers the hook names by where they
live (`cache_service.cache`) are stored as their own snapshot (source `containers`, kind
`container`), so that a container that grows is a suspect of its own.

Allocation sites: when a leak finding opens on the instance, or the detection job finds that the type
view cannot explain a leak (`histograms.python.sites.on_leak`; the collector calls `want_sites`), the
probe starts the hook's tracemalloc session with the configured frames and budgets, then takes a
`sites` snapshot every `sites.interval` while the session runs (whoever started it: `medic heap NAME
--sites` too), stored as source `tracemalloc` (kind `site`) with the containers that hold what was
allocated, so that the suspects ranking names the line that allocates what grows and what holds it.
The session stops itself in the target when its time or memory budget runs out; the probe says so
(events `sites_started` and `sites_stopped`, the latter with the reason and the setting to raise).

The native shim has neither op: for such targets the probe stays quiet, as it does without a hook
(the allocator probe already says how to add one).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from agent.core.errors import ProbeError, ProbeUnavailable, TargetGone
from agent.core.records import Event, ProbeResult, ProbeTarget, Sample
from agent.core.units import format_bytes, format_duration
from native_hooks.client import HookClient
from native_hooks.errors import HookNotFound, HookOpUnavailable, HookRequestError
from native_hooks.sockets import namespace_pids
from probes.allocator import hook_socket_for
from probes.base import Schedule
from probes.linux.procfs import HOST_ROOT, proc_path
from probes.pysnapshots import containers_snapshot_from_reply, sites_snapshot_from_reply, snapshot_from_reply
from probes.settings import PythonHistograms, PythonSites, settings_for

__all__ = ["PythonHistogramProbe", "sites_snapshot_from_reply", "snapshot_from_reply"]

Key = tuple[str, int, float]
SITES_TIMEOUT = 10.0
MAX_BUDGET = 10.0  # the most CPU the hook lets one walk take
_STOPPED = re.compile(r"not tracing allocations \((?P<reason>.*)\): send sites_start first", re.S)
# what the hook's reasons speak of, and the setting that raises it
_SETTINGS = (
    ("memory budget", "histograms.python.sites.max_memory"),
    ("time budget", "histograms.python.sites.duration"),
)


@dataclass(slots=True)
class _Session:
    """A tracing session the probe has seen: when the hook started it, and the snapshots taken."""

    started_at: float | None
    seen_at: float
    snapshots: int = 0


class PythonHistogramProbe:
    name: ClassVar[str] = "pyhist"
    schedule: ClassVar[Schedule] = "slow"

    def __init__(self, root: Path = HOST_ROOT) -> None:
        self.root = root
        self._next: dict[Key, float] = {}  # when the next type histogram is due
        self._sites_next: dict[Key, float] = {}  # when the next sites snapshot is due
        self._start_sites: set[str] = set()  # instances whose tracing session should start
        self._no_sites: set[Key] = set()  # hooks without the sites ops (the native shim)
        self._sessions: dict[Key, _Session] = {}  # the tracing session each process runs
        self._lock = threading.Lock()

    def want_sites(self, instance: str) -> None:
        """Start allocation-site tracing on `instance` at its next collect (a leak it cannot explain)."""
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
        budget = min(settings.budget, MAX_BUDGET)
        timeout = max(hook_timeout, walk_timeout(budget), SITES_TIMEOUT if sites_due else 0.0)
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
            budget = min(settings.budget, MAX_BUDGET)
            reply = client.request(
                "histogram",
                top=settings.top,
                budget_s=budget,
                wall_s=walk_timeout(budget) - 1.0,  # an older hook ignores it
            )
        except HookOpUnavailable as exc:
            raise HookOpUnavailable(_with_setting(str(exc), settings.budget), exc.code) from None
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
        containers = containers_snapshot_from_reply(target, now, reply)
        if containers is not None:
            result.snapshots.append(containers)

    def _sites(
        self,
        client: HookClient,
        target: ProbeTarget,
        now: float,
        settings: PythonSites,
        start: bool,
        result: ProbeResult,
    ) -> None:
        """Start the session when asked, then one `sites` snapshot if the target is tracing; say when a
        session starts and when it ended."""
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
        except HookOpUnavailable as exc:
            self._ended(key, target, now, str(exc), settings, result)
            return  # not tracing (never started, or stopped by its budget): nothing to read
        except HookRequestError as exc:
            if exc.code == "unknown_op":
                with self._lock:
                    self._no_sites.add(key)  # the native shim (or an older hook)
                return
            result.problems.append(exc)
            return
        snapshot = sites_snapshot_from_reply(target, now, reply)
        self._running(key, target, now, snapshot.meta.get("started_at"), settings, result)
        result.snapshots.append(snapshot)

    def _running(
        self,
        key: Key,
        target: ProbeTarget,
        now: float,
        started_at: Any,
        settings: PythonSites,
        result: ProbeResult,
    ) -> None:
        """Count a snapshot of the session; a session not seen before is said (`sites_started`)."""
        with self._lock:
            session = self._sessions.get(key)
            fresh = session is None or (started_at is not None and session.started_at != started_at)
            if fresh:
                session = self._sessions[key] = _Session(started_at, now)
            assert session is not None
            session.snapshots += 1
        if fresh:
            result.events.append(
                Event(
                    "sites_started",
                    f"tracing allocation sites in {target.instance} (tracemalloc, {settings.frames} frames, "
                    f"for at most {format_duration(settings.duration)} and "
                    f"{format_bytes(settings.max_memory)} of its own tables): a snapshot every "
                    f"{format_duration(settings.interval)}",
                    target.instance,
                    data={"pid": target.pid, "started_at": started_at, "interval": settings.interval},
                )
            )

    def _ended(
        self,
        key: Key,
        target: ProbeTarget,
        now: float,
        message: str,
        settings: PythonSites,
        result: ProbeResult,
    ) -> None:
        """A session the probe saw running has ended: one `sites_stopped` event, with the hook's reason,
        the snapshots taken, and the setting that would have kept it going."""
        with self._lock:
            session = self._sessions.pop(key, None)
        if session is None:
            return
        found = _STOPPED.search(message)
        reason = found.group("reason") if found else message
        setting = next((name for words, name in _SETTINGS if words in reason), None)
        advice = ""
        if setting is not None:
            now_is = settings.max_memory if setting.endswith("max_memory") else settings.duration
            shown = format_bytes(now_is) if setting.endswith("max_memory") else format_duration(now_is)
            advice = f"; raise {setting} (now {shown}) for a longer session"
        lasted = now - (session.started_at or session.seen_at)
        result.events.append(
            Event(
                "sites_stopped",
                f"allocation-site tracing in {target.instance} ended after {format_duration(lasted)} and "
                f"{session.snapshots} snapshots: {reason}{advice}",
                target.instance,
                severity="warning" if setting is not None and "memory" in setting else "info",
                data={
                    "pid": target.pid,
                    "reason": reason[:300],
                    "setting": setting,
                    "snapshots": session.snapshots,
                    "lasted_s": round(lasted, 3),
                },
            )
        )

    def forget(self, target: ProbeTarget) -> None:
        key = (target.instance, target.pid, target.start_time)
        with self._lock:
            self._next.pop(key, None)
            self._sites_next.pop(key, None)
            self._no_sites.discard(key)
            self._sessions.pop(key, None)


def walk_timeout(budget: float) -> float:
    """How long the probe waits for a type walk of `budget` seconds of the target's CPU: on a busy
    host the walk gets only part of a CPU (the hook stops a second before)."""
    return 4 * budget + 2.0


def _with_setting(message: str, budget: float) -> str:
    """The hook's refusal with the setting that governs it: an older hook speaks of its request's
    `budget_s` and `max_objects`, which are no settings of medic's."""
    if "histograms.python.budget" in message:
        return message
    return (
        f"{message} (medic sends histograms.python.budget, now {format_duration(budget)}, as budget_s; an "
        "older hook in the target also refuses heaps past its max_objects, which no setting raises: "
        "update medic_hook in the target's image for walks that sample large heaps)"
    )
