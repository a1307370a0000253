"""Which allocator another process uses, seen from outside: /proc/PID/maps, environ and ELF symbols.

Mapped is not used: a library can pull in libjemalloc while `malloc` stays glibc's. So the verdict
follows the dynamic linker's symbol search order — LD_PRELOAD entries, then the executable, then its
DT_NEEDED libraries breadth-first — and the first object that *defines* `malloc` serves it. An
executable that defines `malloc` has a statically linked allocator, identified by its symbols
(`mallctl`, `je_*`, `_rjem_*`, `tc_malloc`, `mi_malloc`) or by jemalloc's `<jemalloc>:` messages
in `.rodata` when stripped. Files are opened through /proc/PID/root so containers work. Reading a
process's maps and environ needs the same uid or root.

The ELF files are the target's choice (its root, its LD_PRELOAD, possibly its own directories): they
are only parsed, never executed, and opened without following a final symlink, as regular files no
larger than `MAX_ELF_BYTES` (a FIFO planted there would otherwise hang a root medic's open).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.core.errors import ProbeError, TargetGone, UnsafePath
from probes.linux.fstrust import open_regular_file
from probes.linux.maps import Mapping, read_maps
from probes.linux.procfs import HOST_ROOT, proc_path, read_environ, read_exe

if TYPE_CHECKING:
    from elftools.elf.elffile import ELFFile

MAX_ELF_BYTES = 16 * 2**30

_LIBRARY_ALLOCATORS = (
    (re.compile(r"^libjemalloc"), "jemalloc"),
    (re.compile(r"^libtcmalloc"), "tcmalloc"),
    (re.compile(r"^libmimalloc"), "mimalloc"),
    (re.compile(r"^libc\.so"), "glibc"),
    (re.compile(r"^libc\.musl|^ld-musl"), "musl"),
)


@dataclass(slots=True)
class AllocatorGuess:
    """The verdict and why: `allocator` is jemalloc|tcmalloc|mimalloc|glibc|musl|unknown."""

    allocator: str
    object_path: str = ""
    static: bool = False
    stats_exported: bool = True  # mallctl / MallocExtension reachable by the shim's dlsym
    heap_profiler: bool = False  # tcmalloc full (not _minimal); jemalloc built with prof
    preload: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    evidence: list[str] = field(default_factory=list)
    is_python: bool = False
    mapped_allocators: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "allocator": self.allocator,
            "object": self.object_path,
            "static": self.static,
            "stats_exported": self.stats_exported,
            "heap_profiler": self.heap_profiler,
            "preload": self.preload,
            "env": self.env,
            "evidence": self.evidence,
            "is_python": self.is_python,
            "mapped_allocators": self.mapped_allocators,
        }


def mapped_files(mappings: list[Mapping]) -> list[str]:
    """Distinct file-backed objects (absolute paths), in address order; deleted files are skipped."""
    seen: dict[str, None] = {}
    for mapping in mappings:
        if mapping.inode and mapping.path.startswith("/") and not mapping.deleted:
            seen.setdefault(mapping.path, None)
    return list(seen)


def allocator_of_library(path: str) -> str | None:
    name = os.path.basename(path)
    for pattern, allocator in _LIBRARY_ALLOCATORS:
        if pattern.search(name):
            return allocator
    return None


# -- ELF -------------------------------------------------------------------------------------------
class _Elf:
    """The few facts we need from one ELF file, read lazily: soname and DT_NEEDED at once, symbol
    lookups through the hash table (cheap even for huge libraries), `.symtab` and `.rodata` on demand."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.soname: str | None = None
        self.needed: list[str] = []
        self._lookups: dict[str, bool] = {}
        self._static: set[str] | None = None
        self._dynamic: set[str] | None = None
        with self._open() as elf:
            from elftools.elf.dynamic import DynamicSection

            for section in elf.iter_sections():
                if isinstance(section, DynamicSection):
                    for tag in section.iter_tags():
                        # pyelftools sets `needed` and `soname` with setattr, for those tags only
                        if tag.entry.d_tag == "DT_NEEDED":
                            self.needed.append(tag.needed)  # type: ignore[attr-defined]
                        elif tag.entry.d_tag == "DT_SONAME":
                            self.soname = tag.soname  # type: ignore[attr-defined]

    @contextlib.contextmanager
    def _open(self) -> Iterator[ELFFile]:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile

        try:
            with open_regular_file(self.path, MAX_ELF_BYTES) as f:
                yield ELFFile(f)
        except (OSError, UnsafePath, ELFError, ValueError, AssertionError) as exc:
            raise ProbeError(f"cannot read ELF file {self.path}: {exc}") from None

    def defines(self, name: str) -> bool:
        """True when the dynamic symbol table defines `name` (what the dynamic linker would bind)."""
        if name not in self._lookups:
            with self._open() as elf:
                from elftools.elf.hash import ELFHashSection, GNUHashSection

                table = next(
                    (s for s in elf.iter_sections() if isinstance(s, (GNUHashSection, ELFHashSection))), None
                )
                if table is not None:
                    symbol = table.get_symbol(name)
                    self._lookups[name] = symbol is not None and symbol["st_shndx"] != "SHN_UNDEF"
                else:
                    self._lookups[name] = name in self.dynamic_symbols()
        return self._lookups[name]

    def _defined(self, section_name: str) -> set[str]:
        with self._open() as elf:
            section = elf.get_section_by_name(section_name)
            if section is None:
                return set()
            # .dynsym and .symtab are symbol tables; pyelftools types the lookup as a plain Section
            symbols = section.iter_symbols()  # type: ignore[attr-defined]
            return {s.name for s in symbols if s["st_shndx"] != "SHN_UNDEF" and s.name}

    def dynamic_symbols(self) -> set[str]:
        if self._dynamic is None:
            self._dynamic = self._defined(".dynsym")
        return self._dynamic

    def static_symbols(self) -> set[str]:
        if self._static is None:
            self._static = self._defined(".symtab")
        return self._static

    def rodata_has(self, needle: bytes) -> bool:
        with self._open() as elf:
            section = elf.get_section_by_name(".rodata")
            return section is not None and section.data_size < 256 * 1024 * 1024 and needle in section.data()


def _static_allocator(elf: _Elf) -> tuple[str, list[str]]:
    dynamic, static = elf.dynamic_symbols(), elf.static_symbols()
    symbols = dynamic | static
    evidence = []
    if "mallctl" in dynamic:
        evidence.append("the executable exports mallctl (linked with -rdynamic)")
    elif "mallctl" in static:
        evidence.append(".symtab has mallctl")
    if any(s.startswith("_rjem_") for s in symbols):
        evidence.append("_rjem_ symbols (Rust tikv-jemallocator)")
    elif any(s.startswith("je_") for s in symbols):
        evidence.append("je_ symbols")
    if evidence or elf.rodata_has(b"<jemalloc>:"):
        if not evidence or "mallctl" not in symbols:
            evidence.append("the executable's .rodata contains '<jemalloc>:'")
        return "jemalloc", evidence
    if "tc_malloc" in symbols or "MallocExtension_GetNumericProperty" in symbols:
        return "tcmalloc", ["tc_malloc / MallocExtension symbols in the executable"]
    if "mi_malloc" in symbols:
        return "mimalloc", ["mi_malloc symbol in the executable"]
    return "unknown", ["no known allocator symbols (stripped?)"]


# -- the verdict -----------------------------------------------------------------------------------
def detect_allocator(pid: int, root: Path = HOST_ROOT) -> AllocatorGuess:
    """Which allocator serves `malloc` in `pid`; raises `TargetGone` / `ProbeAccessDenied`."""
    try:
        maps = read_maps(pid, root)
    except TargetGone:
        raise TargetGone(f"process {pid} does not exist") from None
    exe = read_exe(pid, root) or ""
    try:
        env = read_environ(pid, root)
    except ProbeError:
        env = {}
    target_root = proc_path(root, pid, "root")
    files = mapped_files(maps)
    guess = AllocatorGuess(allocator="unknown")
    guess.env = {
        k: v
        for k, v in env.items()
        if k
        in ("LD_PRELOAD", "MALLOC_CONF", "HEAPPROFILE", "PYTHONMALLOC", "MEDIC_HOOK_SOCKET", "MEDIC_HOOK_DIR")
    }
    guess.preload = [p for p in re.split(r"[:\s]+", env.get("LD_PRELOAD", "")) if p]
    guess.is_python = os.path.basename(exe).startswith("python") or any(
        os.path.basename(f).startswith("libpython") for f in files
    )
    guess.mapped_allocators = sorted({a for f in files if (a := allocator_of_library(f)) and a != "glibc"})

    elves: dict[str, _Elf | None] = {}

    def elf(path: str) -> _Elf | None:
        if path not in elves:
            elves[path] = None
            for candidate in (target_root + path, path):
                try:
                    elves[path] = _Elf(candidate)
                    break
                except ProbeError:
                    continue
        return elves[path]

    by_name: dict[str, str] = {}
    for path in files:
        by_name.setdefault(os.path.basename(path), path)
    for path in files:  # a soname can differ from the file name (libtcmalloc_minimal.so.4 -> .so.4.5.10)
        parsed = elf(path) if path.endswith(".so") or ".so." in path else None
        if parsed is not None and parsed.soname:
            by_name.setdefault(parsed.soname, path)

    # the search order: preloads, the executable, then DT_NEEDED breadth-first
    order: list[str] = []
    for entry in guess.preload:
        found = by_name.get(os.path.basename(entry)) or (entry if entry in files else None)
        if found:
            order.append(found)
    order.append(exe)
    queue, seen = deque([exe]), {exe}
    while queue:
        current = elf(queue.popleft())
        for soname in current.needed if current else []:
            library = by_name.get(soname)
            if library and library not in seen:
                seen.add(library)
                order.append(library)
                queue.append(library)

    for path in dict.fromkeys(order):
        parsed = elf(path)
        if parsed is None or not parsed.defines("malloc"):
            continue
        guess.object_path = path
        if path == exe:
            guess.static = True
            guess.allocator, evidence = _static_allocator(parsed)
            guess.evidence.append(f"the executable {exe} defines malloc (statically linked allocator)")
            guess.evidence += evidence
            guess.stats_exported = parsed.defines("mallctl") or parsed.defines(
                "MallocExtension_GetNumericProperty"
            )
        else:
            guess.allocator = allocator_of_library(path) or "unknown"
            guess.evidence.append(f"malloc resolves to {path}")
            if path in [by_name.get(os.path.basename(p)) for p in guess.preload]:
                guess.evidence.append("loaded by LD_PRELOAD")
            guess.heap_profiler = guess.allocator == "tcmalloc" and parsed.defines("HeapProfilerStart")
            if guess.allocator == "jemalloc":
                guess.heap_profiler = True  # Debian's build has --enable-prof; the hook reports opt.prof
        break
    for name in guess.mapped_allocators:
        if name != guess.allocator:
            guess.evidence.append(f"{name} is mapped but does not serve malloc")
    return guess
