"""The allocator that serves `malloc` in this process, behind one interface: figures, purge, heap profiles.

It runs inside targets, so it lives in `medic_hook.allocator` (the hook's self-contained package); this
name re-exports it for medic's own tools and tests. docs/allocators.md maps the figure names.
"""

from __future__ import annotations

from medic_hook.allocator import (
    DlInfo,
    GlibcAllocator,
    JemallocAllocator,
    LocalAllocator,
    TcmallocAllocator,
    glibc_figures,
    jemalloc_figures,
    local_allocator,
    malloc_address,
    malloc_owner,
    object_of,
    process_memory,
    rss_bytes,
    tcmalloc_figures,
)

__all__ = [
    "DlInfo",
    "GlibcAllocator",
    "JemallocAllocator",
    "LocalAllocator",
    "TcmallocAllocator",
    "glibc_figures",
    "jemalloc_figures",
    "local_allocator",
    "malloc_address",
    "malloc_owner",
    "object_of",
    "process_memory",
    "rss_bytes",
    "tcmalloc_figures",
]
