"""jemalloc's `mallctl` through ctypes.

Types follow the jemalloc manual: bool is 1 byte, unsigned 4, size_t/ssize_t/uint64_t 8, strings
`char *`. jemalloc copies data even when it then returns EINVAL for a wrong length, so every call's
return code is checked. Statistics are cached until `epoch` is written: `refresh()` before reading
`stats.*`. jemalloc cannot be dlopen'ed late (static TLS): it must be LD_PRELOADed or linked.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from typing import Any

from medic_hook.dl import process_symbols
from medic_hook.errors import AllocatorError, MallctlError

MALLCTL_ARENAS_ALL = 4096  # the pseudo arena index meaning "all arenas" (jemalloc >= 5)
JEMALLOC_STATS = ("allocated", "active", "metadata", "resident", "mapped", "retained")
_OPTIONS_SIZE = ("opt.lg_prof_sample", "opt.oversize_threshold")
_OPTIONS_SSIZE = ("opt.lg_prof_interval", "opt.dirty_decay_ms", "opt.muzzy_decay_ms")
_OPTIONS_BOOL = ("opt.prof", "opt.prof_active", "opt.prof_accum", "opt.background_thread", "opt.prof_final")
_OPTIONS_UNSIGNED = ("opt.narenas",)
_OPTIONS_STR = ("opt.prof_prefix", "opt.metadata_thp", "opt.thp")


class Mallctl:
    """Read and write jemalloc controls by name; raises `MallctlError` with a message that says what to do."""

    def __init__(self, function: Any) -> None:
        function.argtypes = [
            ctypes.c_char_p,
            ctypes.c_void_p,
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_void_p,
            ctypes.c_size_t,
        ]
        function.restype = ctypes.c_int
        self._mallctl = function
        self.address = ctypes.cast(function, ctypes.c_void_p).value

    @classmethod
    def find(cls) -> Mallctl | None:
        """The `mallctl` visible in the global symbol scope, or None (jemalloc not loaded or not exported)."""
        # the process's symbols through one cached PyDLL (medic_hook.dl): it keeps the GIL held during
        # the call, and a new handle per call would leave a new ctypes type in the host each time
        function = getattr(process_symbols(), "mallctl", None)
        return cls(function) if function is not None else None

    def _call(self, name: str, old: Any, new: Any, action: str) -> None:
        oldp = ctypes.byref(old) if old is not None else None
        oldlen = ctypes.byref(ctypes.c_size_t(ctypes.sizeof(old))) if old is not None else None
        newp = ctypes.byref(new) if new is not None else None
        newlen = ctypes.sizeof(new) if new is not None else 0
        rc = self._mallctl(name.encode(), oldp, oldlen, newp, newlen)
        if rc:
            raise self._error(name, rc, action)

    def _read(self, name: str, ctype: type) -> Any:
        value = ctype()
        self._call(name, value, None, "read")
        return value.value

    def _exchange(self, name: str, ctype: type, new_value: Any) -> Any:
        old, new = ctype(), ctype(new_value)
        self._call(name, old, new, "write")
        return old.value

    def read_size_t(self, name: str) -> int:
        return int(self._read(name, ctypes.c_size_t))

    def read_ssize_t(self, name: str) -> int:
        return int(self._read(name, ctypes.c_ssize_t))

    def read_unsigned(self, name: str) -> int:
        return int(self._read(name, ctypes.c_uint))

    def read_uint64(self, name: str) -> int:
        return int(self._read(name, ctypes.c_uint64))

    def read_bool(self, name: str) -> bool:
        return bool(self._read(name, ctypes.c_bool))

    def read_str(self, name: str) -> str | None:
        raw = self._read(name, ctypes.c_char_p)  # oldp is a char **: jemalloc hands out its own string
        return raw.decode(errors="replace") if raw is not None else None

    def write_bool(self, name: str, value: bool) -> bool:
        """Set a bool control and return its previous value."""
        return bool(self._exchange(name, ctypes.c_bool, value))

    def write_size_t(self, name: str, value: int) -> None:
        self._call(name, None, ctypes.c_size_t(value), "write")

    def write_unsigned(self, name: str, value: int) -> None:
        self._call(name, None, ctypes.c_uint(value), "write")

    def write_uint64(self, name: str, value: int) -> None:
        self._call(name, None, ctypes.c_uint64(value), "write")

    def write_str(self, name: str, value: str) -> None:
        self._call(name, None, ctypes.c_char_p(os.fsencode(value)), "write")

    def call(self, name: str) -> None:
        """Run a void control such as `arena.4096.purge`."""
        self._call(name, None, None, "call")

    def refresh(self) -> int:
        """Write `epoch` so that `stats.*` are recomputed (it merges all arenas: tens of µs)."""
        return int(self._exchange("epoch", ctypes.c_uint64, 1))

    def version(self) -> str:
        return self.read_str("version") or "unknown"

    def page_size(self) -> int:
        return self.read_size_t("arenas.page")

    def stats(self, refresh: bool = True) -> dict[str, int]:
        """`stats.allocated/active/metadata/resident/mapped/retained` plus dirty and muzzy bytes of all arenas."""
        if refresh:
            self.refresh()
        figures = {name: self.read_size_t(f"stats.{name}") for name in JEMALLOC_STATS}
        page = self.page_size()
        for kind in ("dirty", "muzzy"):
            try:
                figures[kind] = page * self.read_size_t(f"stats.arenas.{MALLCTL_ARENAS_ALL}.p{kind}")
            except MallctlError:
                pass  # older jemalloc without merged arena stats
        return figures

    def arena_stats(self, refresh: bool = True) -> list[dict[str, int]]:
        """Dirty and muzzy bytes per initialised arena (arenas jemalloc has not created yet are skipped)."""
        if refresh:
            self.refresh()
        page = self.page_size()
        arenas = []
        for index in range(self.read_unsigned("arenas.narenas")):
            try:
                row = {
                    "arena": index,
                    "active": page * self.read_size_t(f"stats.arenas.{index}.pactive"),
                    "dirty": page * self.read_size_t(f"stats.arenas.{index}.pdirty"),
                    "muzzy": page * self.read_size_t(f"stats.arenas.{index}.pmuzzy"),
                }
            except MallctlError:
                continue  # EFAULT: arena not created yet (the huge arena is lazy)
            arenas.append(row)
        return arenas

    def options(self) -> dict[str, Any]:
        """The `opt.*` settings that matter for diagnosis; options this build lacks are left out."""
        readers: list[tuple[tuple[str, ...], Callable[[str], Any]]] = [
            (_OPTIONS_BOOL, self.read_bool),
            (_OPTIONS_SIZE, self.read_size_t),
            (_OPTIONS_SSIZE, self.read_ssize_t),
            (_OPTIONS_UNSIGNED, self.read_unsigned),
            (_OPTIONS_STR, self.read_str),
        ]
        options: dict[str, Any] = {}
        for names, reader in readers:
            for name in names:
                try:
                    options[name] = reader(name)
                except MallctlError:
                    continue
        return options

    def purge(self) -> None:
        """Return the unused dirty pages of every arena to the OS."""
        self.call(f"arena.{MALLCTL_ARENAS_ALL}.purge")

    def prof_built(self) -> bool:
        try:
            return self.read_bool("config.prof")
        except MallctlError:
            return False

    def prof_enabled(self) -> bool:
        """True when the process started with `MALLOC_CONF=prof:true` (it cannot be switched on later)."""
        try:
            return self.read_bool("opt.prof")
        except MallctlError:
            return False

    def prof_active(self, active: bool) -> bool:
        """Switch sampling on or off; returns the previous state."""
        return self.write_bool("prof.active", active)

    def prof_dump(self, path: str) -> None:
        """Write a heap profile (heap_v2 format) to `path`; the directory must exist and be writable."""
        self.write_str("prof.dump", path)

    def prof_reset(self, lg_sample: int | None = None) -> None:
        """Forget the samples so far, optionally with a new sampling rate (2**lg_sample bytes)."""
        if lg_sample is None:
            self.call("prof.reset")
        else:
            self.write_size_t("prof.reset", lg_sample)

    def _error(self, name: str, rc: int, action: str) -> MallctlError:
        code = errno.errorcode.get(rc, str(rc))
        prefix = f"mallctl {name!r} ({action}) failed with {code}"
        if rc == errno.ENOENT and name.startswith("prof."):
            if not self.prof_built():
                hint = "this jemalloc was built without profiling (--enable-prof)"
            else:
                hint = (
                    "heap profiling is not enabled in this process: start it with "
                    "MALLOC_CONF=prof:true,prof_active:false (jemalloc reads it only at start)"
                )
        elif rc == errno.ENOENT and name.startswith("stats."):
            hint = "this jemalloc was built without statistics (--disable-stats) or does not know this figure"
        elif rc == errno.ENOENT:
            hint = "this jemalloc has no such control; check its version with `version`"
        elif rc == errno.EINVAL:
            hint = "the value has the wrong size or is out of range for this control"
        elif rc == errno.EPERM:
            hint = "this control is read-only"
        elif rc == errno.EFAULT and name == "prof.dump":
            hint = (
                "jemalloc could not write the file: the directory must exist and be writable by the process"
            )
        elif rc == errno.EFAULT:
            hint = "the arena does not exist yet (jemalloc creates some arenas lazily)"
        elif rc == errno.EAGAIN:
            hint = "jemalloc is busy or out of memory; try again"
        else:
            hint = os.strerror(rc)
        return MallctlError(f"{prefix}: {hint}", name, rc)


def require_jemalloc() -> Mallctl:
    """The process's `mallctl`, or an `AllocatorError` that says how to load jemalloc."""
    found = Mallctl.find()
    if found is None:
        raise AllocatorError(
            "jemalloc's mallctl is not reachable in this process: start it with LD_PRELOAD=libjemalloc.so.2 "
            "(Debian package libjemalloc2); jemalloc cannot be loaded into a running process"
        )
    return found
