"""Python allocation sites: `tracemalloc` started on demand, read in bounded snapshots, stopped by budget.

`sites_start` starts tracing with a few frames per allocation (default 5) under a time budget (default
15 min) and a memory budget for tracemalloc's own tables (default 16 MiB); `sites` takes one snapshot
and returns the top sites by live bytes; `sites_stop` stops. tracemalloc sees only what is allocated
after it starts, so a site's bytes are its growth since then: a cache that fills keeps rising, a
bounded one levels off at its cap. The hook's server thread checks the budgets on every turn of its
loop (no thread of its own) and stops tracing when one runs out; stopping clears every trace and
frees tracemalloc's memory. A host that traces by itself keeps its tracing: the hook reads it and
never stops it.

A site is named by the innermost frame outside the standard library: an `int` made by
`random.randrange` and kept in a record is the application line's allocation, the line on-call can
change (the traceback still shows the whole path). An allocation made entirely in the standard library
keeps its innermost frame.

Allocations made by the hook itself (any frame in this package, or in tracemalloc) are left out. So
that they can be, tracing records at least `OWN_DEPTH` frames whatever was asked (the hook's reply is
encoded three frames deep inside the json module); a traceback shown keeps the frames asked for.
A snapshot copies the trace table and groups it under the GIL, a few µs per live traced allocation
(docs/performance.md); the memory budget bounds that too (about 50 bytes of tracemalloc's tables per
trace: 16 MiB is some 300,000 traces). It also names the containers that hold what was allocated and
the line that adds to them (`medic_hook.holders`, within `HOLDERS_BUDGET_S` of CPU for the scan of
module globals; 5-8 % of a snapshot's cost).
"""

from __future__ import annotations

import functools
import os
import sysconfig
import threading
import time
from dataclasses import dataclass
from typing import Any

from medic_hook.errors import RequestError

DEFAULT_FRAMES = 5
MAX_FRAMES = 25
OWN_DEPTH = 4  # frames that reach the hook from an allocation in its reply: json's three and the hook's
DEFAULT_DURATION_S = 900.0
MAX_DURATION_S = 6 * 3600.0
DEFAULT_MAX_MEMORY = 16 * 2**20
MAX_MEMORY = 256 * 2**20
CHECK_EVERY_S = 1.0  # how often the server loop looks at the budgets while tracing
HOLDERS_BUDGET_S = 0.25  # CPU seconds a snapshot spends looking for the containers that hold its sites
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


@functools.cache
def _stdlib_dirs() -> tuple[str, ...]:
    """The stdlib's directories, asked of sysconfig on first use: its build variables (120 KiB) stay
    out of a process that imports this module and never traces. Site-packages lies under the
    platform's stdlib on some layouts: never skipped (see `_site_frame`)."""
    return tuple({os.path.join(sysconfig.get_paths()[key], "") for key in ("stdlib", "platstdlib")})


@dataclass(slots=True)
class _Session:
    owned: bool  # started by the hook (only then does the hook stop it)
    frames: int
    started: float  # wall time
    deadline: float  # monotonic
    max_memory: int


_session: _Session | None = None
_stopped: tuple[str, float] | None = None  # why and when the last session ended
_lock = threading.Lock()


def tracing() -> bool:
    return _session is not None


def start(frames: int, duration_s: float, max_memory: int) -> dict[str, Any]:
    """Start tracing (or renew the budgets of the running session); the status after it."""
    import tracemalloc

    global _session
    with _lock:
        deadline = time.monotonic() + duration_s
        if _session is not None:
            _session.deadline, _session.max_memory = deadline, max_memory
        elif tracemalloc.is_tracing():
            _session = _Session(False, tracemalloc.get_traceback_limit(), time.time(), deadline, max_memory)
        else:
            tracemalloc.start(max(frames, OWN_DEPTH))
            _session = _Session(True, frames, time.time(), deadline, max_memory)
    return status()


def stop(reason: str = "stopped on request") -> dict[str, Any]:
    """Stop a session the hook started (traces cleared, tracemalloc's memory freed); the status after it."""
    global _session, _stopped
    with _lock:
        session, _session = _session, None
        if session is not None:
            _stopped = (reason, time.time())
            if session.owned:
                import tracemalloc

                tracemalloc.stop()
    return status()


def status() -> dict[str, Any]:
    session = _session
    if session is None:
        reason, when = _stopped or (None, None)
        return {"tracing": False, "stopped_reason": reason, "stopped_at": when}
    import tracemalloc

    traced, peak = tracemalloc.get_traced_memory()
    return {
        "tracing": True,
        "owned": session.owned,
        "frames": session.frames,
        "started_at": round(session.started, 3),
        "remaining_s": round(max(0.0, session.deadline - time.monotonic()), 3),
        "traced_bytes": traced,
        "traced_peak_bytes": peak,
        "tracemalloc_bytes": tracemalloc.get_tracemalloc_memory(),
        "max_memory": session.max_memory,
    }


def enforce_budget() -> float | None:
    """Stop tracing when a budget ran out; seconds until the next check (None: nothing to check)."""
    session = _session
    if session is None:
        return None
    import tracemalloc

    left = session.deadline - time.monotonic()
    if left <= 0:
        stop(f"time budget of the session ran out after {time.time() - session.started:.0f}s")
        return None
    used = tracemalloc.get_tracemalloc_memory()
    if used > session.max_memory:
        stop(f"tracemalloc used {used} bytes, over the memory budget of {session.max_memory}")
        return None
    return min(CHECK_EVERY_S, left)


def after_fork_in_child() -> None:
    """A forked child did not ask for tracing: stop what the parent's hook started."""
    global _session, _lock
    _lock = threading.Lock()
    session, _session = _session, None
    if session is not None and session.owned:
        import tracemalloc

        tracemalloc.stop()


def _stdlib(filename: str) -> bool:
    return (
        filename.startswith(_stdlib_dirs())
        and "site-packages" not in filename
        and "dist-packages" not in filename
    ) or filename.startswith("<frozen ")


def _site_frame(traceback: Any) -> Any:
    """The innermost frame of `traceback` (oldest first) outside the standard library, else the innermost."""
    for frame in reversed(traceback):
        if not _stdlib(frame.filename):
            return frame
    return traceback[-1]


def snapshot(top: int, holders: bool = True) -> dict[str, Any]:
    """The `top` sites by live bytes allocated since tracing started, each with a short traceback,
    and (with `holders`) the containers that hold what was allocated (`medic_hook.holders`).

    A site is the line that allocated (`file:line`); the traceback shown is the heaviest of the
    call paths that reached it, innermost first.
    """
    import tracemalloc

    if enforce_budget() is None:
        reason = (_stopped or ("it was never started", 0.0))[0]
        raise RequestError("unavailable", f"not tracing allocations ({reason}): send sites_start first")
    started = time.perf_counter()
    taken = tracemalloc.take_snapshot()
    own = (_PACKAGE_DIR + os.sep, tracemalloc.__file__)
    held = _holders(getattr(taken.traces, "_traces", None), own) if holders else []
    # grouped first (one dict lookup per trace), filtered after, per distinct call path: a
    # `Filter` matches every frame of every trace with fnmatch, seconds under the GIL for a big table
    statistics = taken.statistics("traceback")
    del taken
    sites: dict[tuple[str, int], list[Any]] = {}  # (file, line) -> [bytes, count, heaviest bytes, traceback]
    total_bytes = total_count = 0
    for stat in statistics:
        if any(f.filename.startswith(own) for f in stat.traceback):
            continue  # the hook's own allocations
        frame = _site_frame(stat.traceback)
        total_bytes += stat.size
        total_count += stat.count
        row = sites.get((frame.filename, frame.lineno))
        if row is None:
            sites[(frame.filename, frame.lineno)] = [stat.size, stat.count, stat.size, stat.traceback]
            continue
        row[0] += stat.size
        row[1] += stat.count
        if stat.size > row[2]:
            row[2], row[3] = stat.size, stat.traceback
    del statistics
    ranked = sorted(sites.items(), key=lambda item: (-item[1][0], item[0]))[:top]
    session = _session
    shown = session.frames if session is not None else MAX_FRAMES
    rows = [
        {
            "site": f"{filename}:{lineno}",
            "bytes": size,
            "count": count,
            "traceback": [f"{f.filename}:{f.lineno}" for f in reversed(traceback)][:shown],
        }
        for (filename, lineno), (size, count, _, traceback) in ranked
    ]
    distinct = len(sites)
    del sites, ranked
    return {
        **status(),
        "sites": rows,
        "distinct_sites": distinct,
        "total_bytes": total_bytes,
        "total_count": total_count,
        "holders": held,
        "elapsed_s": round(time.perf_counter() - started, 6),
    }


def _holders(traces: Any, own: tuple[str, ...]) -> list[dict[str, Any]]:
    """The containers holding what was allocated while tracing, within `HOLDERS_BUDGET_S` of CPU."""
    from medic_hook.holders import holders

    started = time.thread_time()
    return holders(traces, own, _stdlib, lambda: time.thread_time() - started > HOLDERS_BUDGET_S)
