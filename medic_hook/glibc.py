"""glibc malloc through ctypes (`mallinfo2`, `malloc_trim`, `mallopt`, `malloc_info`) and a parser for
`malloc_info`'s XML.

`mallinfo2` (glibc >= 2.33) sums all arenas; it walks the free lists, so it costs more when the heap
holds many free chunks. `malloc_trim(0)` returns only whole free pages inside free chunks.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

from medic_hook.dl import free_function, libc
from medic_hook.errors import AllocatorError

MALLINFO2_FIELDS = (
    "arena",  # bytes obtained with brk/mmap for arenas (not the mmapped chunks)
    "ordblks",  # free chunks
    "smblks",  # free fastbin chunks
    "hblks",  # mmapped chunks
    "hblkhd",  # bytes in mmapped chunks
    "usmblks",  # always 0
    "fsmblks",  # bytes in free fastbin chunks
    "uordblks",  # bytes in use (not counting mmapped chunks)
    "fordblks",  # free bytes in arenas
    "keepcost",  # top-most releasable bytes
)
PAGE = 4096


class Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in MALLINFO2_FIELDS]


class GlibcMalloc:
    """The glibc allocator of this process."""

    def __init__(self, libc: Any) -> None:
        self._libc = libc
        libc.mallinfo2.restype = Mallinfo2
        libc.mallinfo2.argtypes = []
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
        libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
        libc.open_memstream.restype = ctypes.c_void_p  # FILE *
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.malloc_info.restype = ctypes.c_int
        libc.fclose.argtypes = [ctypes.c_void_p]
        libc.fclose.restype = ctypes.c_int
        # the memstream buffer comes from whichever malloc serves the process: free it through the same
        self._free = free_function()

    @classmethod
    def find(cls) -> GlibcMalloc | None:
        """glibc's functions, or None on a libc without `mallinfo2` (glibc < 2.33, musl)."""
        lib = libc()  # keeps the GIL: see medic_hook.dl
        return cls(lib) if lib is not None and hasattr(lib, "mallinfo2") else None

    def mallinfo2(self) -> dict[str, int]:
        info = self._libc.mallinfo2()
        return {name: int(getattr(info, name)) for name in MALLINFO2_FIELDS}

    def trim(self, pad: int = 0) -> bool:
        """`malloc_trim(pad)` on every arena; True when some memory was released."""
        return bool(self._libc.malloc_trim(pad))

    def mallopt(self, param: int, value: int) -> bool:
        """`mallopt(param, value)` (the `M_*` constants of malloc.h); False when glibc refused it."""
        return bool(self._libc.mallopt(param, value))

    def info_xml(self) -> str:
        """`malloc_info(0, ...)` captured through an in-memory stream."""
        buf, size = ctypes.c_void_p(), ctypes.c_size_t()
        stream = self._libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
        if not stream:
            raise AllocatorError("open_memstream failed: out of memory while reading malloc_info")
        rc = self._libc.malloc_info(0, stream)
        self._libc.fclose(stream)  # buf and size are valid only after fclose
        try:
            text = ctypes.string_at(buf.value, size.value).decode(errors="replace") if buf.value else ""
        finally:
            self._free(buf)
        if rc != 0:
            raise AllocatorError(f"malloc_info returned {rc}: glibc could not describe its heap")
        return text


def require_glibc() -> GlibcMalloc:
    found = GlibcMalloc.find()
    if found is None:
        raise AllocatorError("glibc's mallinfo2 is not available here (glibc older than 2.33, or not glibc)")
    return found


@dataclass(frozen=True, slots=True)
class FreeBucket:
    """Free chunks of one size range of one heap (`<size from to total count/>`)."""

    low: int
    high: int
    total: int
    count: int


@dataclass(slots=True)
class HeapInfo:
    nr: int
    fast_count: int = 0
    fast_bytes: int = 0
    rest_count: int = 0
    rest_bytes: int = 0
    system_current: int = 0
    system_max: int = 0
    buckets: list[FreeBucket] = field(default_factory=list)


@dataclass(slots=True)
class MallocInfo:
    """`malloc_info` parsed: per-heap free lists and the process-wide totals."""

    heaps: list[HeapInfo] = field(default_factory=list)
    fast_count: int = 0
    fast_bytes: int = 0
    rest_count: int = 0
    rest_bytes: int = 0
    mmap_count: int = 0
    mmap_bytes: int = 0
    system_current: int = 0
    system_max: int = 0

    def trimmable_bytes(self, page: int = PAGE) -> int:
        """A lower bound of what `malloc_trim(0)` can return: whole pages inside free chunks of 2+ pages.

        A free chunk of `s` bytes holds at least `s - 2 * page` bytes of whole pages, whatever its
        alignment; smaller gaps hold none.
        """
        return sum(
            max(0, bucket.total - 2 * page * bucket.count)
            for heap in self.heaps
            for bucket in heap.buckets
            if bucket.low >= 2 * page
        )

    def to_dict(self) -> dict[str, int]:
        return {
            "heaps": len(self.heaps),
            "free_chunks": self.rest_count + self.fast_count,
            "free_bytes": self.rest_bytes + self.fast_bytes,
            "mmap_chunks": self.mmap_count,
            "mmap_bytes": self.mmap_bytes,
            "system_current": self.system_current,
            "system_max": self.system_max,
            "trimmable_bytes": self.trimmable_bytes(),
        }


def _int_attr(element: Any, name: str, where: str) -> int:
    raw = element.get(name)
    if raw is None:
        raise AllocatorError(f"malloc_info XML: <{element.tag}> in {where} has no {name!r} attribute")
    try:
        value = int(raw)
    except ValueError:
        raise AllocatorError(
            f"malloc_info XML: <{element.tag}> in {where} has {name}={raw!r}, expected an integer"
        ) from None
    if value < 0:
        raise AllocatorError(f"malloc_info XML: <{element.tag}> in {where} has a negative {name} ({value})")
    return value


def _apply_total(target: HeapInfo | MallocInfo, element: Any, where: str) -> None:
    kind = element.get("type")
    count, size = _int_attr(element, "count", where), _int_attr(element, "size", where)
    if kind == "fast":
        target.fast_count, target.fast_bytes = count, size
    elif kind == "rest":
        target.rest_count, target.rest_bytes = count, size
    elif kind == "mmap" and isinstance(target, MallocInfo):
        target.mmap_count, target.mmap_bytes = count, size


def _apply_system(target: HeapInfo | MallocInfo, element: Any, where: str) -> None:
    kind, size = element.get("type"), _int_attr(element, "size", where)
    if kind == "current":
        target.system_current = size
    elif kind == "max":
        target.system_max = size


def parse_malloc_info(text: str | bytes) -> MallocInfo:
    """Parse glibc's `malloc_info` XML; raises `AllocatorError` naming the element at fault."""
    from xml.etree import ElementTree  # only `stats` with detail needs the XML parser

    raw = text.encode() if isinstance(text, str) else text
    if b"<!DOCTYPE" in raw or b"<!ENTITY" in raw:
        raise AllocatorError("malloc_info XML: document type declarations are not allowed")
    try:
        root = ElementTree.fromstring(raw)
    except ElementTree.ParseError as exc:
        raise AllocatorError(f"malloc_info XML is not well formed: {exc}") from None
    if root.tag != "malloc":
        raise AllocatorError(f"malloc_info XML: the root element is <{root.tag}>, expected <malloc>")
    info = MallocInfo()
    for element in root:
        if element.tag == "heap":
            info.heaps.append(_parse_heap(element))
        elif element.tag == "total":
            _apply_total(info, element, "<malloc>")
        elif element.tag == "system":
            _apply_system(info, element, "<malloc>")
    return info


def _parse_heap(element: Any) -> HeapInfo:
    heap = HeapInfo(nr=_int_attr(element, "nr", "<malloc>"))
    where = f"<heap nr={heap.nr}>"
    for child in element:
        if child.tag == "sizes":
            for bucket in child:
                if bucket.tag in ("size", "unsorted"):
                    heap.buckets.append(
                        FreeBucket(
                            low=_int_attr(bucket, "from", where),
                            high=_int_attr(bucket, "to", where),
                            total=_int_attr(bucket, "total", where),
                            count=_int_attr(bucket, "count", where),
                        )
                    )
        elif child.tag == "total":
            _apply_total(heap, child, where)
        elif child.tag == "system":
            _apply_system(heap, child, where)
    return heap
