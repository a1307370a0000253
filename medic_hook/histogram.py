"""The Python type histogram: counts and shallow sizes of live objects per type.

`gc.get_objects()` lists only objects the collector tracks (containers and class instances); atomic
objects such as `str`, `bytes` and `int` appear only when `referents=True` adds the untracked objects
that tracked ones point to. Walking holds the GIL, so the host's threads slow down meanwhile: the
walk refuses heaps larger than `max_objects` before it starts (estimated from
`sys.getallocatedblocks()`, or from RSS when pymalloc is off) and stops at `budget_s`.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from medic_hook.allocator import rss_bytes
from medic_hook.errors import RequestError

_CHECK_EVERY = 4096
_MIN_BYTES_PER_OBJECT = 16


def estimate_objects() -> tuple[int, str]:
    """A cheap upper-bound-ish estimate of the number of live objects, and how it was made."""
    blocks = sys.getallocatedblocks()
    if blocks:
        return blocks, "pymalloc allocated blocks"
    return rss_bytes() // _MIN_BYTES_PER_OBJECT, "RSS / 16 bytes (pymalloc is off)"


def _type_name(kind: type) -> str:
    module = getattr(kind, "__module__", None)
    qualname = getattr(kind, "__qualname__", kind.__name__)
    return qualname if module in (None, "builtins") else f"{module}.{qualname}"


def _size(obj: Any) -> int:
    try:
        return sys.getsizeof(obj)
    except Exception:  # a broken __sizeof__ in the host's code must not break the walk
        return 0


def type_histogram(
    top: int = 50, max_objects: int = 2_000_000, budget_s: float = 1.0, referents: bool = False
) -> dict[str, Any]:
    """Counts and shallow sizes per type, the `top` largest by count; raises `RequestError`
    (`too_expensive`) when the heap is too large or the walk overran its budget."""
    import gc

    estimate, how = estimate_objects()
    if estimate > max_objects:
        raise RequestError(
            "too_expensive",
            f"heap too large to walk: about {estimate} objects ({how}) > max_objects {max_objects}; "
            "raise max_objects (the walk holds the GIL) or use heap profiles instead",
        )
    started = time.perf_counter()
    deadline = started + budget_s
    counts: dict[type, list[int]] = {}
    seen_untracked: set[int] = set()
    walked = 0
    objects = gc.get_objects()
    try:
        for obj in objects:
            walked += 1
            if walked % _CHECK_EVERY == 0 and time.perf_counter() > deadline:
                raise RequestError(
                    "too_expensive",
                    f"histogram walk exceeded its budget of {budget_s}s after {walked} of {len(objects)} "
                    "objects; raise budget_s (at most 10) or use heap profiles instead",
                )
            row = counts.setdefault(type(obj), [0, 0])
            row[0] += 1
            row[1] += _size(obj)
            if referents:
                for ref in gc.get_referents(obj):
                    if not gc.is_tracked(ref) and id(ref) not in seen_untracked:
                        seen_untracked.add(id(ref))
                        ref_row = counts.setdefault(type(ref), [0, 0])
                        ref_row[0] += 1
                        ref_row[1] += _size(ref)
    finally:
        del objects  # drop the references to every object before returning
    rows = sorted(counts.items(), key=lambda item: (-item[1][0], -item[1][1]))
    return {
        "objects": walked + len(seen_untracked),
        "tracked_objects": walked,
        "distinct_types": len(rows),
        "types": [{"type": _type_name(kind), "count": c, "bytes": b} for kind, (c, b) in rows[:top]],
        "elapsed_s": round(time.perf_counter() - started, 6),
        "referents": referents,
    }
