"""glibc malloc through ctypes (`mallinfo2`, `malloc_trim`, `malloc_info`) and a parser for `malloc_info`'s
XML: `medic_hook`'s, re-exported (the bindings run inside targets, so they live in the hook's package).
"""

from __future__ import annotations

from medic_hook.glibc import (
    MALLINFO2_FIELDS,
    PAGE,
    FreeBucket,
    GlibcMalloc,
    HeapInfo,
    Mallinfo2,
    MallocInfo,
    parse_malloc_info,
)
from medic_hook.glibc import require_glibc as require

__all__ = [
    "MALLINFO2_FIELDS",
    "PAGE",
    "FreeBucket",
    "GlibcMalloc",
    "HeapInfo",
    "Mallinfo2",
    "MallocInfo",
    "parse_malloc_info",
    "require",
]
