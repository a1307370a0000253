"""The `heapprof` probe: native heap profiles (jemalloc heap_v2, gperftools) turned into allocation-site
snapshots, for instances with `histograms.heap_profiles: {dir: …}` (opt-in; off otherwise).

Every `interval` it gets one fresh dump of the target:
1. through the hook (LD_PRELOAD shim or Python hook): `prof_active` once (jemalloc sampling on, or
   tcmalloc's profiler started), then `prof_dump` into `dir` (the directory must be writable by the
   target; medic keeps its last `keep` dumps there);
2. else from the dumps the allocator writes by itself into `dir`: jemalloc
   `prof_prefix:DIR/p,lg_prof_interval:N` (`p.<pid>.<seq>.i<n>.heap`) or gperftools `HEAPPROFILE=DIR/p`
   (`p.0001.heap`), the newest one written since the process started and at least a second old.
The dump is parsed, symbolized with the maps it carries and aggregated by site (`frames` frames
outside the allocator); the snapshot is timestamped when the dump was written.

The directory and the dumps are the target's to write, hence untrusted: a dump is read only when it
is a regular file owned by the target's user or medic's, reached without following a symlink, and
not larger than `MAX_PROFILE_BYTES`; the hook's replies count only when its socket's peer is the
target process itself (SO_PEERCRED).
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from agent.core.errors import ProbeError, ProbeUnavailable, TargetGone
from agent.core.histograms import HistogramRow, Snapshot
from agent.core.records import ProbeResult, ProbeTarget, Sample
from native_hooks.client import HookClient
from native_hooks.errors import HookNotFound, HookOpUnavailable
from native_hooks.heapprofile import HeapProfile, read_heap_profile
from native_hooks.heapsites import allocation_sites
from native_hooks.sockets import namespace_pids
from native_hooks.symbolize import Symbolizer
from probes.allocator import hook_socket_for
from probes.base import Schedule
from probes.linux.helpers import process_ids, run_as
from probes.linux.maps import read_maps
from probes.linux.procfs import HOST_ROOT, proc_path, read_environ
from probes.settings import HeapProfiles, opted_in, settings_for

SETTLE_S = 1.0  # a dump younger than this may still be being written
HOWTO = (
    "start the target under jemalloc with MALLOC_CONF=prof:true,prof_active:false and the medic shim "
    "(medic then dumps into the directory), or with "
    "MALLOC_CONF=prof:true,lg_prof_interval:30,prof_prefix:DIR/jeprof, or under libtcmalloc.so.4 with "
    "HEAPPROFILE=DIR/hp (docs/histograms.md)"
)


@dataclass
class _State:
    next_at: float = 0.0
    seq: int = 0
    hook: bool | None = None  # None: not used yet; False: the hook cannot dump, use the allocator's files
    consumed: tuple[str, int] | None = None  # the last dump read from the directory (name, mtime_ns)
    written: list[str] = field(default_factory=list)


class HeapProfileProbe:
    name: ClassVar[str] = "heapprof"
    schedule: ClassVar[Schedule] = "slow"

    def __init__(self, root: Path = HOST_ROOT) -> None:
        self.root = root
        self.symbolizer = Symbolizer()
        self._states: dict[tuple[str, int, float], _State] = {}
        self._lock = threading.Lock()

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        if not opted_in(target, "heap_profiles"):
            return ProbeResult()
        spec = settings_for(target, "heap_profiles", HeapProfiles)
        key = (target.instance, target.pid, target.start_time)
        with self._lock:
            state = self._states.setdefault(key, _State())
        if now < state.next_at:
            return ProbeResult()
        if not os.path.exists(proc_path(self.root, target.pid)):
            raise TargetGone(f"process {target.pid} of {target.instance} is gone")
        state.next_at = now + spec.interval  # a failed dump waits its interval too
        path = self._dump_through_hook(target, spec, state) if state.hook is not False else None
        written_at = now
        if path is None:
            found = newest_dump(spec.dir, target, state.consumed, self.root)
            if found is None:
                if state.consumed is None and not writes_dumps(target.pid, self.root):
                    raise ProbeUnavailable(f"no heap profiles of pid {target.pid} in {spec.dir}: {HOWTO}")
                return ProbeResult()  # no new dump yet
            path, mtime_ns = found
            state.consumed = (os.path.basename(path), mtime_ns)
            written_at = mtime_ns / 1e9
        ids = process_ids(target.pid, self.root)
        profile = read_heap_profile(path, owners={ids.uid, os.geteuid()})  # written by the target
        self.symbolizer.run_as = run_as(ids, os.geteuid())
        snapshot = self.snapshot(target, profile, spec.frames, written_at)
        return ProbeResult(
            samples=[Sample(target.instance, "heap_profile_live_bytes", now, profile.live_bytes)],
            snapshots=[snapshot],
        )

    def snapshot(self, target: ProbeTarget, profile: HeapProfile, frames: int, ts: float) -> Snapshot:
        """The allocation-site snapshot of one dump (symbolized through the target's root when it runs)."""
        maps = profile.mappings or read_maps(target.pid, self.root)
        root = proc_path(self.root, target.pid, "root")
        self.symbolizer.root = root if os.access(root, os.R_OK) else ""
        sites = allocation_sites(profile, self.symbolizer, frames, maps)
        rows = [HistogramRow(s.name, s.live_objects, s.live_bytes, _stack(s.stack)) for s in sites]
        meta = {
            "file": profile.source,
            "format": profile.format,
            "sample_period": profile.sample_period,
            "frames": frames,
            "alloc_bytes": sum(s.alloc_bytes for s in sites),
        }
        return Snapshot(
            target.instance,
            profile.format,
            ts,
            rows,
            profile.live_objects,
            profile.live_bytes,
            target.pid,
            target.start_time,
            len(rows),
            meta,
        )

    def forget(self, target: ProbeTarget) -> None:
        with self._lock:
            self._states.pop((target.instance, target.pid, target.start_time), None)

    # ---------------------------------------------------------------------------------- hook mode
    def _dump_through_hook(self, target: ProbeTarget, spec: HeapProfiles, state: _State) -> str | None:
        """Path of a fresh dump written by the target through its hook, or None when it cannot dump."""
        try:
            socket = hook_socket_for(target, self.root)
        except HookNotFound:
            return None  # no hook (yet): the allocator's own dumps, if any; the hook is tried again next time
        timeout = max(float((target.settings.get("hook") or {}).get("timeout") or 1.0), 30.0)
        directory = Path(spec.dir)
        prefix = directory / f"medic.{target.instance}.{target.pid}"
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            with HookClient(socket, timeout, pid=target.pid, root=self.root) as client:
                pid = client.request("ping").get("pid")
                if isinstance(pid, int) and pid not in namespace_pids(target.pid, self.root):
                    state.hook = False
                    return None
                if state.hook is None:
                    client.request("prof_active", active=True, prefix=str(prefix))
                state.hook = True
                state.seq += 1
                path = f"{prefix}.{int(time.time())}.{state.seq:04d}.heap"
                client.request("prof_dump", path=path)
        except HookNotFound:
            return None
        except HookOpUnavailable:
            state.hook = False  # glibc, libtcmalloc_minimal, or jemalloc without prof:true: for good
            return None
        except OSError as exc:
            raise ProbeError(
                f"cannot create the heap-profile directory {directory}: {exc.strerror}"
            ) from None
        state.written.append(path)
        while len(state.written) > spec.keep:
            _remove(state.written.pop(0))
        # tcmalloc's profiler, once medic started it with `prefix`, also dumps by itself (prefix.0001.heap…)
        own = re.compile(re.escape(prefix.name) + r"\.\d{4,}\.heap")
        for entry in os.scandir(directory):
            if own.fullmatch(entry.name):
                _remove(entry.path)
        return path


def _stack(frames: tuple[str, ...]) -> str:
    return " ← ".join(frames)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# ---------------------------------------------------------------------------------- file mode
def newest_dump(
    directory: str | Path, target: ProbeTarget, consumed: tuple[str, int] | None, root: Path = HOST_ROOT
) -> tuple[str, int] | None:
    """The newest settled dump of `target` in `directory` other than `consumed`: (path, mtime_ns)."""
    pattern = _dump_pattern(target.pid, root)
    best: tuple[int, str] | None = None
    settled = time.time_ns() - int(SETTLE_S * 1e9)
    born = int((target.start_time - 1.0) * 1e9)
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return None
    for entry in entries:
        if (
            not entry.name.endswith(".heap")
            or entry.name.startswith("medic.")
            or not pattern.search(entry.path)
        ):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISREG(info.st_mode):
            continue  # a symlink or a FIFO planted in the directory is never read
        mtime = info.st_mtime_ns
        if not born <= mtime <= settled or (entry.name, mtime) == consumed:
            continue
        if best is None or (mtime, entry.name) > best:
            best = (mtime, entry.name)
    if best is None or (consumed is not None and best[0] < consumed[1]):
        return None
    return os.path.join(str(directory), best[1]), best[0]


def _dump_pattern(pid: int, root: Path) -> re.Pattern[str]:
    """File names the allocator of `pid` writes: from its MALLOC_CONF prof_prefix and HEAPPROFILE when
    readable, else any jemalloc dump naming one of its pids or any gperftools dump."""
    pids = "|".join(str(p) for p in sorted(namespace_pids(pid, root)))
    jemalloc_tail = rf"\.(?:{pids})\.\d+\.(?:[imu]\d+|f)\.heap$"
    gperf_tail = rf"(?:_(?:{pids}))?\.\d{{4,}}\.heap$"
    env = _environ(pid, root) or {}
    choices = []
    conf = env.get("MALLOC_CONF", "")
    # file names only: the directory is the configured one (and gperftools garbles the first byte of its
    # HEAPPROFILE in the environment once it has started, so that children do not inherit it)
    if match := re.search(r"(?:^|,)prof_prefix:([^,]+)", conf):
        choices.append("/" + re.escape(os.path.basename(match.group(1))) + jemalloc_tail)
    if env.get("HEAPPROFILE"):
        choices.append("/" + re.escape(os.path.basename(env["HEAPPROFILE"])) + gperf_tail)
    if not choices:
        choices = [jemalloc_tail, r"/[^/]*" + gperf_tail]
    return re.compile("|".join(f"(?:{c})" for c in choices))


def writes_dumps(pid: int, root: Path = HOST_ROOT) -> bool:
    """Whether the allocator of `pid` was told to write dumps by itself (unknown environment: assume so)."""
    env = _environ(pid, root)
    if env is None:
        return True
    conf = env.get("MALLOC_CONF", "")
    return bool(env.get("HEAPPROFILE")) or ("prof:true" in conf and "lg_prof_interval" in conf)


def _environ(pid: int, root: Path) -> dict[str, str] | None:
    """The target's environment, or None when it cannot be read."""
    try:
        return read_environ(pid, root)
    except ProbeError:
        return None
