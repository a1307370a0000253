"""The allocator that serves `malloc` in this process, behind one interface: figures, purge, heap profiles.

"Mapped is not used": a library can map jemalloc while `malloc` stays glibc's, so the candidate
(`mallctl`, `MallocExtension_GetNumericProperty`, `mallinfo2`) must live in the same object as
`dladdr(malloc)`. Figure names (`allocated`, `active`, `resident`, `mapped`, `retained`, `metadata`,
`free`, `purgeable`) are the same for every allocator and for the C shim (docs/allocators.md);
figures an allocator does not have are left out, never zero.
"""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache
from typing import Any

from medic_hook.dl import libc, process_symbols
from medic_hook.errors import AllocatorError, RequestError
from medic_hook.glibc import GlibcMalloc, parse_malloc_info
from medic_hook.jemalloc import JEMALLOC_STATS, MALLCTL_ARENAS_ALL, Mallctl
from medic_hook.tcmalloc import Tcmalloc


class DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


@lru_cache(maxsize=1)
def _dladdr_function() -> Any:
    function = process_symbols().dladdr
    function.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    function.restype = ctypes.c_int
    return function


def _dladdr(address: int | None) -> DlInfo | None:
    if not address:
        return None
    info = DlInfo()
    return info if _dladdr_function()(ctypes.c_void_p(address), ctypes.byref(info)) else None


def malloc_address() -> int:
    return ctypes.cast(process_symbols().malloc, ctypes.c_void_p).value or 0


def object_of(address: int | None) -> tuple[int, str] | None:
    """(load base, file name) of the object that holds `address`."""
    info = _dladdr(address)
    if info is None:
        return None
    return int(info.dli_fbase or 0), os.fsdecode(info.dli_fname or b"")


def malloc_owner() -> str:
    """File name of the object whose `malloc` this process calls (the truth, whatever else is mapped)."""
    found = object_of(malloc_address())
    return found[1] if found else ""


def _serves_malloc(address: int | None) -> bool:
    mine, malloc = object_of(address), object_of(malloc_address())
    return mine is not None and malloc is not None and mine[0] == malloc[0]


def process_memory() -> dict[str, int]:
    """RSS and virtual size of this process from /proc/self/statm (microseconds, no allocation spike)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            size, resident = statm.read().split()[:2]
    except (OSError, ValueError):
        return {}
    page = os.sysconf("SC_PAGE_SIZE")
    return {"rss_bytes": int(resident) * page, "vms_bytes": int(size) * page}


def rss_bytes() -> int:
    return process_memory().get("rss_bytes", 0)


def jemalloc_figures(native: dict[str, int]) -> dict[str, int]:
    figures = {name: native[name] for name in JEMALLOC_STATS if name in native}
    dirty, muzzy = native.get("dirty"), native.get("muzzy")
    if dirty is not None and muzzy is not None:
        figures["dirty"], figures["muzzy"] = dirty, muzzy
        figures["purgeable"] = dirty + muzzy
        if "active" in native and "allocated" in native:
            figures["free"] = max(0, native["active"] - native["allocated"]) + dirty + muzzy
    return figures


def tcmalloc_figures(props: dict[str, int]) -> dict[str, int]:
    heap = props.get("generic.heap_size", 0)
    unmapped = props.get("tcmalloc.pageheap_unmapped_bytes", 0)
    page_free = props.get("tcmalloc.pageheap_free_bytes", 0)
    physical = props.get("generic.total_physical_bytes", max(0, heap - unmapped))
    caches = sum(
        props.get(name, 0)
        for name in (
            "tcmalloc.central_cache_free_bytes",
            "tcmalloc.transfer_cache_free_bytes",
            "tcmalloc.thread_cache_free_bytes",
        )
    )
    return {
        "allocated": props.get("generic.current_allocated_bytes", 0),
        "active": max(0, heap - page_free - unmapped),
        "resident": physical,
        "mapped": heap,
        "retained": unmapped,
        "metadata": max(0, physical - (heap - unmapped)),
        "free": page_free + caches,
        "purgeable": page_free,
    }


def glibc_figures(info: dict[str, int], rss: int | None) -> dict[str, int]:
    mapped = info["arena"] + info["hblkhd"]
    return {
        "allocated": info["uordblks"] + info["hblkhd"],
        "mapped": mapped,
        # an upper bound: glibc cannot tell which free pages a trim gave back, and a process cannot
        # hold more of its heap resident than its whole RSS
        "resident": min(mapped, rss) if rss else mapped,
        "free": info["fordblks"],
    }


class LocalAllocator:
    """An allocator we cannot introspect: every operation says so."""

    name = "unknown"

    def __init__(self, object_path: str) -> None:
        self.object_path = object_path

    def version(self) -> str | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "allocator": self.name,
            "allocator_object": self.object_path,
            "allocator_version": self.version(),
        }

    def stats(self, detail: bool = False) -> dict[str, Any]:
        return {"figures": {}, "native": {}}

    def purge(self) -> str:
        raise RequestError(
            "unsupported",
            f"malloc is served by {self.object_path or 'the executable'}, an allocator medic cannot drive: "
            "purge needs jemalloc, tcmalloc or glibc",
        )

    def prof_dump(self, path: str) -> dict[str, Any]:
        raise RequestError(
            "unsupported",
            f"{self.name} malloc has no heap profiler: run the target under jemalloc "
            "(LD_PRELOAD=libjemalloc.so.2 MALLOC_CONF=prof:true,prof_active:false) or tcmalloc "
            "(LD_PRELOAD=libtcmalloc.so.4 HEAPPROFILE=/dir/prefix)",
        )

    def prof_active(self, active: bool, prefix: str | None) -> dict[str, Any]:
        return self.prof_dump("")  # the same "no heap profiler here" answer


class JemallocAllocator(LocalAllocator):
    name = "jemalloc"

    def __init__(self, object_path: str, mallctl: Mallctl) -> None:
        super().__init__(object_path)
        self.mallctl = mallctl

    def version(self) -> str | None:
        return self.mallctl.version()

    def stats(self, detail: bool = False) -> dict[str, Any]:
        native = self.mallctl.stats()
        result: dict[str, Any] = {
            "figures": jemalloc_figures(native),
            "native": {
                f"stats.{key}" if key in JEMALLOC_STATS else key: value for key, value in native.items()
            },
            "prof": {"enabled": self.mallctl.prof_enabled(), "active": self._prof_active_now()},
        }
        if detail:
            result["arenas"] = self.mallctl.arena_stats(refresh=False)
            result["options"] = self.mallctl.options()
        return result

    def _prof_active_now(self) -> bool:
        try:
            return self.mallctl.read_bool("prof.active")
        except AllocatorError:
            return False

    def purge(self) -> str:
        self.mallctl.purge()
        return f"arena.{MALLCTL_ARENAS_ALL}.purge"

    def _require_prof(self) -> None:
        if not self.mallctl.prof_enabled():
            raise RequestError(
                "unavailable",
                "heap profiling is off in this process: start it with MALLOC_CONF=prof:true,prof_active:false "
                "(jemalloc reads it only at start; sampling then costs nothing until switched on)"
                if self.mallctl.prof_built()
                else "this jemalloc was built without profiling (--enable-prof)",
            )

    def prof_dump(self, path: str) -> dict[str, Any]:
        self._require_prof()
        self.mallctl.prof_dump(path)
        return {"format": "jemalloc"}

    def prof_active(self, active: bool, prefix: str | None) -> dict[str, Any]:
        self._require_prof()
        return {"active": active, "previous": self.mallctl.prof_active(active)}


class TcmallocAllocator(LocalAllocator):
    name = "tcmalloc"

    def __init__(self, object_path: str, tc: Tcmalloc) -> None:
        super().__init__(object_path)
        self.tc = tc

    def stats(self, detail: bool = False) -> dict[str, Any]:
        props = self.tc.properties()
        result: dict[str, Any] = {
            "figures": tcmalloc_figures(props),
            "native": props,
            "prof": {"enabled": self.tc.has_heap_profiler, "active": self.tc.heap_profiler_running()},
        }
        if detail:
            result["stats_text"] = self.tc.stats_text()
        return result

    def purge(self) -> str:
        self.tc.release_free_memory()
        return "MallocExtension_ReleaseFreeMemory"

    def _require_profiler(self) -> None:
        if not self.tc.has_heap_profiler:
            raise RequestError(
                "unavailable",
                "this tcmalloc (libtcmalloc_minimal) has no heap profiler: preload libtcmalloc.so.4 instead",
            )

    def prof_dump(self, path: str) -> dict[str, Any]:
        self._require_profiler()
        if not self.tc.heap_profiler_running():
            raise RequestError(
                "unavailable",
                "tcmalloc's heap profiler is not running: start the target with HEAPPROFILE=/dir/prefix, "
                'or send {"op": "prof_active", "active": true, "prefix": "/dir/prefix"} first',
            )
        profile = self.tc.heap_profile()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(profile)
        return {"format": "gperftools"}

    def prof_active(self, active: bool, prefix: str | None) -> dict[str, Any]:
        self._require_profiler()
        previous = self.tc.heap_profiler_running()
        if active and not previous:
            if not prefix:
                raise RequestError(
                    "bad_request", 'starting tcmalloc\'s heap profiler needs "prefix": /dir/prefix'
                )
            self.tc.heap_profiler_start(prefix)
        elif not active and previous:
            self.tc.heap_profiler_stop()
        return {"active": active, "previous": previous}


class GlibcAllocator(LocalAllocator):
    name = "glibc"

    def __init__(self, object_path: str, malloc: GlibcMalloc) -> None:
        super().__init__(object_path)
        self.malloc = malloc
        self._version = _glibc_version()  # asked once: it cannot change while the process runs

    def version(self) -> str | None:
        return self._version

    def stats(self, detail: bool = False) -> dict[str, Any]:
        info = self.malloc.mallinfo2()
        result: dict[str, Any] = {"figures": glibc_figures(info, rss_bytes()), "native": info}
        if detail:
            result["malloc_info"] = parse_malloc_info(self.malloc.info_xml()).to_dict()
        return result

    def purge(self) -> str:
        self.malloc.trim(0)
        return "malloc_trim(0)"


def _glibc_version() -> str | None:
    lib = libc()
    if lib is None or not hasattr(lib, "gnu_get_libc_version"):
        return None
    lib.gnu_get_libc_version.restype = ctypes.c_char_p
    version: bytes = lib.gnu_get_libc_version()
    return version.decode()


@lru_cache(maxsize=1)
def local_allocator() -> LocalAllocator:
    """The allocator serving `malloc` here; it cannot change during a process's life, so it is cached."""
    owner = malloc_owner()
    je = Mallctl.find()
    if je is not None and _serves_malloc(je.address):
        return JemallocAllocator(owner, je)
    tc = Tcmalloc.find()
    if tc is not None and _serves_malloc(tc.address):
        return TcmallocAllocator(owner, tc)
    if "libc.so" in os.path.basename(owner):
        gl = GlibcMalloc.find()
        if gl is not None:
            return GlibcAllocator(owner, gl)
    return LocalAllocator(owner)
