"""Code addresses → function names, from a memory map and the ELF symbol tables of the mapped objects.

    symbolizer = Symbolizer()
    frames = symbolizer.symbolize(addresses, profile.mappings)   # or probes.linux.maps.read_maps(pid)

For each address: the mapping that holds it gives the object file and the file offset; the object's
`PT_LOAD` segments turn the offset into its link-time address; the symbol (`.symtab`, else `.dynsym`,
plus a separate debug file found by build id under /usr/lib/debug) whose [value, value+size) holds
that address names it. An address inside an object but outside every sized symbol (a stripped
library's local function) is shown as `object+0xoffset` rather than as a wrong neighbour. C++ names
are demangled with `c++filt` (binutils), in one batch. Each object's table is read once and cached
by path, inode, size and mtime, so a rebuilt binary is read again.

Pass `root="/proc/PID/root"` to read a containerized target's files through its mount namespace.

Trust: the objects are named by the target's maps (and may sit in its root or in directories it
writes), so they are only parsed, never executed: opened without following a final symlink, refused
when not a regular file (a FIFO would hang the open) or over `MAX_OBJECT_BYTES`. Reading them as root
is then harmless. `c++filt` is run only from a trusted path (root's or medic's, writable by nobody
else), and as the target's user when `run_as` says so, since it parses names the target chose.
"""

from __future__ import annotations

import os
import struct
import subprocess
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agent.core.errors import UnsafePath
from probes.linux.fstrust import open_regular_file, trusted_program
from probes.linux.helpers import RunAs
from probes.linux.maps import Mapping

if TYPE_CHECKING:
    from elftools.elf.elffile import ELFFile

DEMANGLE_TIMEOUT_S = 20.0
MAX_OBJECT_BYTES = 16 * 2**30  # larger "objects" are not what a process maps for code
_SYM64 = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size
_FUNC_TYPES = (2, 10)  # STT_FUNC, STT_GNU_IFUNC
_BIND_RANK = {1: 0, 2: 1, 0: 2}  # GLOBAL before WEAK before LOCAL when several names share an address


@dataclass(frozen=True, slots=True)
class Frame:
    address: int
    function: str  # demangled name, or `object+0xoffset`, or `0x…` outside every mapping
    object: str  # path of the mapped object ("" when unknown)
    known: bool  # a symbol named it


class ElfSymbols:
    """The function symbols and loadable segments of one ELF file."""

    def __init__(self, path: str, debug_root: str = "/usr/lib/debug") -> None:
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile

        self.path = path
        self.segments: list[tuple[int, int, int]] = []  # (file offset, vaddr, file size) of PT_LOAD
        self.build_id: str | None = None
        table: dict[int, tuple[int, int, str]] = {}  # start -> (rank, size, name)
        try:
            with open_regular_file(path, MAX_OBJECT_BYTES) as handle:
                elf = ELFFile(handle)
                self.segments = [
                    (seg["p_offset"], seg["p_vaddr"], seg["p_filesz"])
                    for seg in elf.iter_segments()
                    if seg["p_type"] == "PT_LOAD"
                ]
                self.build_id = _build_id(elf)
                for name in (".symtab", ".dynsym"):
                    _read_symbols(elf, name, table)
        except (OSError, UnsafePath, ELFError, ValueError, struct.error):
            self.segments = []
        if self.build_id and debug_root:
            debug = Path(debug_root) / ".build-id" / self.build_id[:2] / f"{self.build_id[2:]}.debug"
            try:
                with open_regular_file(debug, MAX_OBJECT_BYTES) as handle:
                    _read_symbols(ELFFile(handle), ".symtab", table)
            except (OSError, UnsafePath, ELFError, ValueError, struct.error):
                pass
        ordered = sorted(table.items())
        self.starts = [start for start, _ in ordered]
        self.sizes = [size for _, (_, size, _) in ordered]
        self.names = [name for _, (_, _, name) in ordered]

    def vaddr(self, file_offset: int) -> int:
        """The link-time address of a file offset (identity when no segment holds it)."""
        for offset, vaddr, size in self.segments:
            if offset <= file_offset < offset + size:
                return file_offset - offset + vaddr
        return file_offset

    def lookup(self, vaddr: int) -> str | None:
        i = bisect_right(self.starts, vaddr) - 1
        if i < 0:
            return None
        size = self.sizes[i]
        if vaddr < self.starts[i] + size or (size == 0 and i + 1 == len(self.starts)):
            return self.names[i]
        if size == 0 and vaddr < self.starts[i + 1]:
            return self.names[i]  # an assembly function without a size, before the next symbol
        return None


def _build_id(elf: ELFFile) -> str | None:
    section = elf.get_section_by_name(".note.gnu.build-id")
    if section is None:
        return None
    # pyelftools types the lookup as a plain Section; a note section's is a NoteSection
    for note in section.iter_notes():  # type: ignore[attr-defined]
        if note["n_type"] == "NT_GNU_BUILD_ID":
            return str(note["n_desc"])
    return None


def _read_symbols(elf: ELFFile, section_name: str, table: dict[int, tuple[int, int, str]]) -> None:
    """Add the function symbols of one symbol table; a fast path for 64-bit little-endian files."""
    section = elf.get_section_by_name(section_name)
    if section is None or section["sh_type"] not in ("SHT_SYMTAB", "SHT_DYNSYM"):
        return
    strtab = elf.get_section(section["sh_link"]).data()
    if elf.elfclass == 64 and elf.little_endian and section["sh_entsize"] == _SYM64.size:
        data = section.data()
        data = data[: len(data) - len(data) % _SYM64.size]
        for name_at, info, _other, shndx, value, size in _SYM64.iter_unpack(data):
            if info & 0xF in _FUNC_TYPES and value and shndx and name_at:
                _add(table, value, size, info >> 4, strtab, name_at)
        return
    # portable, slower; pyelftools makes every SHT_SYMTAB/SHT_DYNSYM section a SymbolTableSection,
    # but types the lookup as a plain Section
    for symbol in section.iter_symbols():  # type: ignore[attr-defined]
        info = symbol["st_info"]
        kind = {"STT_FUNC": 2, "STT_GNU_IFUNC": 10}.get(info["type"])
        if kind and symbol["st_value"] and symbol.name and symbol["st_shndx"] != "SHN_UNDEF":
            bind = {"STB_LOCAL": 0, "STB_GLOBAL": 1, "STB_WEAK": 2}.get(info["bind"], 0)
            _add(table, symbol["st_value"], symbol["st_size"], bind, symbol.name.encode(), 0)


def _add(
    table: dict[int, tuple[int, int, str]], value: int, size: int, bind: int, strtab: bytes, at: int
) -> None:
    rank = _BIND_RANK.get(bind, 3)
    known = table.get(value)
    if known is not None and (known[0] < rank or (known[0] == rank and known[1] >= size)):
        return
    end = strtab.find(b"\0", at)
    name = strtab[at : end if end >= 0 else len(strtab)].decode("utf-8", errors="replace")
    if "@" in name:
        name = name.split("@", 1)[0]
    table[value] = (rank, size, name)


class Symbolizer:
    """Names code addresses; keeps each object's symbol table and each demangled name for reuse."""

    def __init__(self, root: str = "", demangle: bool = True, debug_root: str = "/usr/lib/debug") -> None:
        self.root = root.rstrip("/")
        self.demangle = demangle
        self.debug_root = debug_root
        self._objects: dict[tuple[int, int, int, int], ElfSymbols] = {}  # by device, inode, size, mtime
        self._demangled: dict[str, str] = {}
        self.run_as: RunAs = {}  # subprocess credentials for c++filt (`probes.linux.helpers.run_as`)
        self.demangle_problem: str | None = None  # why names stay mangled, when c++filt is refused
        self.demangler: str | None = self._find_demangler() if demangle else None

    def _find_demangler(self) -> str | None:
        """The trusted c++filt, or None (names then stay mangled; `demangle_problem` says why)."""
        try:
            found = trusted_program("c++filt")
        except UnsafePath as exc:
            self.demangle_problem = f"c++filt is not safe to run: {exc}"
            return None
        return str(found) if found is not None else None

    def symbolize(self, addresses: Iterable[int], mappings: Sequence[Mapping]) -> dict[int, Frame]:
        """A `Frame` for each address; never raises for unknown addresses or unreadable objects."""
        files = sorted((m for m in mappings if m.path and not m.path.startswith("[")), key=lambda m: m.start)
        starts = [m.start for m in files]
        frames: dict[int, Frame] = {}
        tables: dict[str, ElfSymbols | None] = {}
        for address in set(addresses):
            i = bisect_right(starts, address) - 1
            if i < 0 or address >= files[i].end:
                frames[address] = Frame(address, f"0x{address:x}", "", False)
                continue
            mapping = files[i]
            offset = address - mapping.start + mapping.offset
            if mapping.path not in tables:
                tables[mapping.path] = self.object_symbols(mapping.path)
            symbols = tables[mapping.path]
            name = symbols.lookup(symbols.vaddr(offset)) if symbols is not None else None
            if name is None:
                frames[address] = Frame(
                    address, f"{os.path.basename(mapping.path)}+0x{offset:x}", mapping.path, False
                )
            else:
                frames[address] = Frame(address, name, mapping.path, True)
        if self.demangler:
            names = self._demangle(
                {f.function for f in frames.values() if f.known and f.function.startswith("_Z")}
            )
            for address, frame in frames.items():
                if frame.function in names:
                    frames[address] = Frame(address, names[frame.function], frame.object, True)
        return frames

    def object_symbols(self, path: str) -> ElfSymbols | None:
        """The cached symbol table of a mapped object, or None when it cannot be read."""
        real = self.root + path.removesuffix(" (deleted)")
        try:
            st = os.stat(real)
        except OSError:
            return None
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)  # the same file through any root
        symbols = self._objects.get(key)
        if symbols is None:
            symbols = ElfSymbols(real, self.debug_root)
            self._objects[key] = symbols
        return symbols

    def _demangle(self, mangled: set[str]) -> dict[str, str]:
        todo = sorted(name for name in mangled if name not in self._demangled and "\n" not in name)
        if todo and self.demangler:
            try:
                done = subprocess.run(
                    [self.demangler],
                    input="\n".join(todo) + "\n",
                    capture_output=True,
                    text=True,
                    timeout=DEMANGLE_TIMEOUT_S,
                    check=True,
                    **self.run_as,
                ).stdout.split("\n")
            except (OSError, subprocess.SubprocessError):
                done = []
            if len(done) >= len(todo):
                self._demangled.update(zip(todo, done))
            else:
                self._demangled.update((name, name) for name in todo)  # keep mangled names, try no more
        return {name: self._demangled.get(name, name) for name in mangled}
