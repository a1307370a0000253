"""gperftools tcmalloc's C API (`MallocExtension_*`, `HeapProfiler*`) through ctypes.

libtcmalloc_minimal.so.4 has the MallocExtension_* functions but no heap profiler; libtcmalloc.so.4
has both. `generic.heap_size` never shrinks: memory held is heap_size - pageheap_unmapped_bytes.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from medic_hook.dl import free_function, process_symbols
from medic_hook.errors import AllocatorError

TCMALLOC_PROPERTIES = (
    "generic.current_allocated_bytes",
    "generic.heap_size",
    "generic.total_physical_bytes",
    "tcmalloc.pageheap_free_bytes",
    "tcmalloc.pageheap_unmapped_bytes",
    "tcmalloc.central_cache_free_bytes",
    "tcmalloc.transfer_cache_free_bytes",
    "tcmalloc.thread_cache_free_bytes",
    "tcmalloc.current_total_thread_cache_bytes",
    "tcmalloc.max_total_thread_cache_bytes",
    "tcmalloc.aggressive_memory_decommit",
)
_STATS_TEXT_BYTES = 64 * 1024
# the buffer's array type, made once: `create_string_buffer` makes it anew whenever a collection has
# freed the previous one, a new type in the host each time
_StatsText = ctypes.c_char * _STATS_TEXT_BYTES


class Tcmalloc:
    """Numeric properties, memory release and the heap profiler of the tcmalloc serving this process."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self._get = lib.MallocExtension_GetNumericProperty
        self._get.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t)]
        self._get.restype = ctypes.c_int
        self.address = ctypes.cast(self._get, ctypes.c_void_p).value
        lib.MallocExtension_ReleaseFreeMemory.restype = None
        lib.MallocExtension_ReleaseFreeMemory.argtypes = []
        self.has_heap_profiler = all(
            hasattr(lib, name)
            for name in ("HeapProfilerStart", "HeapProfilerStop", "IsHeapProfilerRunning", "GetHeapProfile")
        )
        if self.has_heap_profiler:
            lib.HeapProfilerStart.argtypes = [ctypes.c_char_p]
            lib.HeapProfilerStart.restype = None
            lib.HeapProfilerStop.argtypes = []
            lib.HeapProfilerStop.restype = None
            lib.HeapProfilerDump.argtypes = [ctypes.c_char_p]
            lib.HeapProfilerDump.restype = None
            lib.IsHeapProfilerRunning.argtypes = []
            lib.IsHeapProfilerRunning.restype = ctypes.c_int
            lib.GetHeapProfile.argtypes = []
            lib.GetHeapProfile.restype = ctypes.c_void_p  # malloc'ed: we must free it

    @classmethod
    def find(cls) -> Tcmalloc | None:
        lib = process_symbols()  # keeps the GIL: these calls are short (see medic_hook.dl)
        return cls(lib) if hasattr(lib, "MallocExtension_GetNumericProperty") else None

    def property(self, name: str) -> int | None:
        """One numeric property, or None when this tcmalloc does not know it."""
        value = ctypes.c_size_t()
        return int(value.value) if self._get(name.encode(), ctypes.byref(value)) else None

    def properties(self) -> dict[str, int]:
        return {name: value for name in TCMALLOC_PROPERTIES if (value := self.property(name)) is not None}

    def release_free_memory(self) -> None:
        """Return every free page-heap span to the OS (`MallocExtension_ReleaseFreeMemory`)."""
        self._lib.MallocExtension_ReleaseFreeMemory()

    def stats_text(self) -> str:
        """tcmalloc's human-readable report (`MallocExtension_GetStats`)."""
        buf = _StatsText()
        self._lib.MallocExtension_GetStats(buf, ctypes.c_int(_STATS_TEXT_BYTES))
        return buf.value.decode(errors="replace")

    def _require_profiler(self) -> None:
        if not self.has_heap_profiler:
            raise AllocatorError(
                "this tcmalloc has no heap profiler (libtcmalloc_minimal): preload libtcmalloc.so.4 "
                "(Debian package libgoogle-perftools4) instead"
            )

    def heap_profiler_running(self) -> bool:
        return self.has_heap_profiler and bool(self._lib.IsHeapProfilerRunning())

    def heap_profiler_start(self, prefix: str) -> None:
        """Start recording allocations made from now on; tcmalloc writes `<prefix>.NNNN.heap` by itself."""
        self._require_profiler()
        self._lib.HeapProfilerStart(os.fsencode(prefix))

    def heap_profiler_stop(self) -> None:
        self._require_profiler()
        self._lib.HeapProfilerStop()

    def heap_profiler_dump(self, reason: str) -> None:
        """Write the next `<prefix>.NNNN.heap` file of the running profiler."""
        self._require_profiler()
        self._lib.HeapProfilerDump(reason.encode())

    def heap_profile(self) -> bytes:
        """The current profile text (`heap profile: ...`); empty when the profiler is not running."""
        self._require_profiler()
        address = self._lib.GetHeapProfile()
        if not address:
            return b""
        try:
            return ctypes.string_at(address)
        finally:
            free_function()(address)


def require_tcmalloc() -> Tcmalloc:
    found = Tcmalloc.find()
    if found is None:
        raise AllocatorError(
            "tcmalloc's MallocExtension API is not reachable in this process: start it with "
            "LD_PRELOAD=libtcmalloc.so.4 (or libtcmalloc_minimal.so.4)"
        )
    return found
