"""Allocation sites of a heap profile: backtraces symbolized and merged by their first frames outside the
allocator, the way `jeprof --text` ranks functions by what they hold.

A backtrace starts inside the allocator (jemalloc's `prof_backtrace`, `malloc`, `operator new`…); those
leading frames are dropped, and the next `frames` names form the site (`leak_records`, or with
`frames=2` `tensorflow::Tensor::Tensor via ranker::Featurize`). Return addresses other than the first
are moved back one byte so that a call at the very end of a function is named after its caller.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from native_hooks.heapprofile import HeapProfile, StackRecord
from native_hooks.symbolize import Frame, Symbolizer
from probes.linux.maps import Mapping

STACK_DEPTH = 8  # frames kept to show where the heaviest backtrace of a site comes from
_ALLOCATOR_OBJECT = re.compile(r"lib(jemalloc|tcmalloc\w*|medic_shim[^/]*|profiler)\.so")
_ALLOCATOR_FUNCTION = re.compile(
    r"(malloc|calloc|realloc|reallocarray|free|posix_memalign|aligned_alloc|memalign|valloc|pvalloc"
    r"|mallocx|rallocx|xallocx|strdup|strndup|__strdup|__libc_\w+|je_\w+|tc_\w+|_?_?\w*prof_backtrace\w*"
    r"|operator new.*|operator new\[\].*|_Znw\w+|_Zna\w+)"
)


@dataclass(frozen=True, slots=True)
class Site:
    name: str
    live_objects: float
    live_bytes: float
    alloc_objects: float
    alloc_bytes: float
    stack: tuple[str, ...]  # the heaviest backtrace of the site, innermost first, allocator frames dropped
    object: str  # basename of the object holding the site's first frame


def allocation_sites(
    profile: HeapProfile,
    symbolizer: Symbolizer,
    frames: int = 1,
    mappings: Sequence[Mapping] | None = None,
) -> list[Site]:
    """Sites sorted by live bytes, largest first; `mappings` default to the dump's own."""
    maps = profile.mappings if mappings is None else mappings
    wanted = {a - (1 if i else 0) for s in profile.stacks for i, a in enumerate(s.frames)}
    named = symbolizer.symbolize(wanted, maps)
    depth = max(1, frames)
    totals: dict[str, list[float]] = {}
    heaviest: dict[str, tuple[float, int, StackRecord]] = {}  # name -> (weight, first user frame, record)
    for record in profile.stacks:
        first = _first_user_frame(record.frames, named)
        if first is None:
            name = "(allocator only)"
        else:
            chain = record.frames[first : first + depth]
            name = " via ".join(named[a - (1 if first + j else 0)].function for j, a in enumerate(chain))
        row = totals.get(name)
        if row is None:
            row = totals[name] = [0.0, 0.0, 0.0, 0.0]
        row[0] += record.live_objects
        row[1] += record.live_bytes
        row[2] += record.alloc_objects
        row[3] += record.alloc_bytes
        weight = max(record.live_bytes, record.alloc_bytes * 1e-9)
        if name not in heaviest or weight > heaviest[name][0]:
            heaviest[name] = (weight, len(record.frames) if first is None else first, record)
    sites = []
    for name, (n, b, an, ab) in totals.items():
        _, first, record = heaviest[name]
        shown = [
            named[a - (1 if first + j else 0)]
            for j, a in enumerate(record.frames[first : first + STACK_DEPTH])
        ]
        stack = tuple(f.function for f in shown)
        sites.append(Site(name, n, b, an, ab, stack, os.path.basename(shown[0].object) if shown else ""))
    return sorted(sites, key=lambda s: (-s.live_bytes, -s.alloc_bytes, s.name))


def _first_user_frame(addresses: tuple[int, ...], named: dict[int, Frame]) -> int | None:
    """Index of the first frame outside the allocator and its entry points (None: all inside)."""
    for i, address in enumerate(addresses):
        frame = named[address - (1 if i else 0)]
        if not _in_allocator(frame.object, frame.function if frame.known else ""):
            return i
    return None


@lru_cache(maxsize=65536)
def _in_allocator(path: str, function: str) -> bool:
    if _ALLOCATOR_OBJECT.search(os.path.basename(path)):
        return True
    return bool(function) and _ALLOCATOR_FUNCTION.fullmatch(function) is not None
