"""medic's in-process hook for Python targets: a daemon thread answering the hook protocol on a Unix socket.

    import medic_hook
    medic_hook.start()                          # MEDIC_HOOK_SOCKET, else "auto": <dir>/hook.<pid>.sock
    medic_hook.start("/run/medic/api.%p.sock")

or, with no code change, `MEDIC_HOOK_SOCKET=auto` plus the line that `medic hook install-pth` writes
into a `.pth` file of the target's site-packages (it calls `medic_hook.autostart()`).

This one file is all of medic that ever runs inside a target. It imports only the standard library
and never any of medic's packages (`agent`, `probes`, `native_hooks`, ...), so a target with modules
of the same names keeps its own. It leaves behind only its server thread (a daemon named
`medic-hook`) and its socket, removed at exit. The thread never raises into the host: every failure
becomes an error reply. Work per request is bounded (request line <= 4 KiB, histogram walk within a
budget), at most 8 connections are kept (a new one evicts the one idle the longest), idle ones are
dropped after 10 s, and peers must run with our uid or as root (SO_PEERCRED). After `os.fork()` a
child whose path has the pid in it (`%p` or `auto`) serves its own socket; otherwise it serves none.

Sections: socket paths, the protocol, allocators (jemalloc, tcmalloc, glibc through ctypes), the
Python type histogram, operations, the server, the module-level API. Errors raised inside the hook,
all turned into `{"ok": false, "code", "error"}` replies:

Exception
├── RequestError        a request the hook cannot serve; `code` goes into the reply
├── AllocatorError      an allocator call failed (errno, missing symbol, bad output): code "failed"
│   └── MallctlError    jemalloc's mallctl returned an errno
└── ValueError
    └── SocketPathError a socket template that cannot be used (raised by `start`)
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import json
import math
import os
import re
import selectors
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any


class RequestError(Exception):
    """A request the hook cannot accept or serve here; `code` goes into the error reply."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class AllocatorError(Exception):
    """An allocator introspection call failed."""


class MallctlError(AllocatorError):
    """`mallctl(name)` returned an errno; `errno` and `name` are kept for callers that branch on them."""

    def __init__(self, message: str, name: str, errno: int) -> None:
        super().__init__(message)
        self.name = name
        self.errno = errno


class SocketPathError(ValueError):
    """A socket template that cannot be used; the message says why."""


# == socket paths ====================================================================================
# `MEDIC_HOOK_SOCKET` names the socket: `%p` becomes the pid (so a child that inherits the variable
# binds its own socket), `%%` a literal `%`, and `auto` means `<dir>/hook.<pid>.sock`, where `<dir>` is
# the first of $MEDIC_HOOK_DIR, /run/medic (as root), $XDG_RUNTIME_DIR/medic, /tmp/medic-<uid>.
# The C shim (shim.c) applies the same rules; medic finds sockets with native_hooks.sockets.
ENV_SOCKET = "MEDIC_HOOK_SOCKET"
ENV_DIR = "MEDIC_HOOK_DIR"
ENV_DEBUG = "MEDIC_HOOK_DEBUG"
AUTO = "auto"
MAX_PATH_BYTES = 107  # sun_path holds 108 bytes including the terminating NUL


def default_dir(uid: int, env: Mapping[str, str]) -> str:
    """The conventional socket directory for a process with this uid and environment."""
    if env.get(ENV_DIR):
        return env[ENV_DIR]
    if uid == 0:
        return "/run/medic"
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "medic")
    return f"/tmp/medic-{uid}"


def socket_name(pid: int) -> str:
    return f"hook.{pid}.sock"


def expand(template: str, pid: int, uid: int, env: Mapping[str, str]) -> str:
    """The socket path a process with `pid`, `uid` and `env` binds for `template`; raises `SocketPathError`."""
    if not template.strip():
        raise SocketPathError(
            f"{ENV_SOCKET} is empty: set it to 'auto' or to a socket path such as /run/medic/x.%p.sock"
        )
    if template.strip() == AUTO:
        path = os.path.join(default_dir(uid, env), socket_name(pid))
    else:
        path = re.sub(r"%[p%]", lambda m: str(pid) if m.group(0) == "%p" else "%", template)
    if not path.startswith("/"):
        raise SocketPathError(f"hook socket path must be absolute, got {path!r}")
    if "\x00" in path:
        raise SocketPathError("hook socket path must not contain NUL characters")
    if len(os.fsencode(path)) > MAX_PATH_BYTES:
        raise SocketPathError(
            f"hook socket path {path!r} is longer than {MAX_PATH_BYTES} bytes (the Unix socket limit): "
            "choose a shorter directory"
        )
    return path


def has_pid(template: str) -> bool:
    """True when each process gets its own path (`auto` or a `%p` template)."""
    return template.strip() == AUTO or "%p" in template.replace("%%", "")


def is_live(path: str, timeout: float = 0.5) -> bool:
    """True when something accepts connections on `path` (any error but 'refused'/'missing' counts as live)."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout)
    try:
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        return True
    finally:
        probe.close()
    return True


def _socket_dir(directory: str) -> None:
    """Create `directory` (mode 0700) if missing; refuse a non-directory or one owned by someone else."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise SocketPathError(f"{directory} exists but is not a directory")
    if info.st_uid not in (os.geteuid(), 0):
        raise SocketPathError(
            f"{directory} belongs to uid {info.st_uid}, not to us: refusing to put a socket there"
        )


def bind_listener(path: str, backlog: int = 16) -> socket.socket:
    """A listening socket at `path` with mode 0600, bound without touching the process umask.

    The socket is bound in a private staging directory and renamed into place, so it is never
    reachable with looser permissions. A stale socket is replaced; a live one raises `FileExistsError`;
    a non-socket file at `path` raises `SocketPathError`.
    """
    directory = os.path.dirname(path)
    _socket_dir(directory)
    with contextlib.suppress(FileNotFoundError):
        info = os.lstat(path)
        if not stat.S_ISSOCK(info.st_mode):
            raise SocketPathError(f"{path} exists and is not a socket: refusing to replace it")
        if is_live(path):
            raise FileExistsError(errno.EADDRINUSE, f"another process serves {path}", path)
    staging = os.path.join(directory, f".medic-{os.getpid()}-{os.urandom(6).hex()}")
    os.mkdir(staging, 0o700)
    staged = os.path.join(staging, "s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        listener.bind(staged)
        os.chmod(staged, 0o600)
        listener.listen(backlog)
        os.rename(staged, path)
    except BaseException:
        listener.close()
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(staged)
        with contextlib.suppress(OSError):
            os.rmdir(staging)
    return listener


# == the protocol ====================================================================================
# One JSON object per line each way. Requests: `{"op": OP, ...}`; replies `{"ok": true, "op": ...}` or
# `{"ok": false, "code": CODE, "error": "what and what to do"}`. A request line is at most
# MAX_REQUEST_BYTES (the C shim has the same limit). tests/test_hook_contract.py runs one suite on
# this hook and on the shim.
PROTOCOL_VERSION = 1
MAX_REQUEST_BYTES = 4096  # including the newline
MAX_REPLY_BYTES = 8 * 1024 * 1024
OPS = ("ping", "stats", "purge", "prof_dump", "prof_active", "histogram")
SHIM_OPS = ("ping", "stats", "purge", "prof_dump", "prof_active")
# codes of {"ok": false} replies; medic's client maps unsupported/unavailable to "probe unavailable"
ERROR_CODES = (
    "bad_request",
    "too_large",
    "unknown_op",
    "unsupported",
    "unavailable",
    "too_expensive",
    "failed",
    "permission",
)


def decode_request(line: bytes) -> dict[str, Any]:
    """One request line (without its newline) as a dict with a string `op`; raises `RequestError`."""
    if len(line) >= MAX_REQUEST_BYTES:
        raise RequestError("too_large", f"request longer than {MAX_REQUEST_BYTES - 1} bytes")
    try:
        request = json.loads(line.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RequestError("bad_request", f"request is not one JSON object: {str(exc)[:200]}") from None
    if not isinstance(request, dict):
        raise RequestError("bad_request", f"request must be a JSON object, got {type(request).__name__}")
    op = request.get("op")
    if not isinstance(op, str):
        raise RequestError("bad_request", 'request needs "op": a string such as "ping" or "stats"')
    return request


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def encode(message: dict[str, Any]) -> bytes:
    """One line of compact ASCII JSON; floats that JSON cannot carry become null."""
    return (json.dumps(_finite(message), separators=(",", ":"), ensure_ascii=True) + "\n").encode()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(key): _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def error_reply(code: str, message: str) -> dict[str, Any]:
    return {"ok": False, "code": code, "error": message}


def require_str(request: dict[str, Any], key: str, *, absolute_path: bool = False) -> str:
    value = request.get(key)
    if not isinstance(value, str) or not value:
        raise RequestError("bad_request", f'{request["op"]} needs "{key}": a non-empty string')
    if "\x00" in value:
        raise RequestError("bad_request", f'"{key}" must not contain NUL characters')
    if absolute_path and not value.startswith("/"):
        raise RequestError("bad_request", f'"{key}" must be an absolute path, got {value!r}')
    return value


def optional_int(request: dict[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = request.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise RequestError("bad_request", f'"{key}" must be an integer from {low} to {high}, got {value!r}')
    return value


def optional_float(request: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = request.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise RequestError("bad_request", f'"{key}" must be a number from {low} to {high}, got {value!r}')
    return float(value)


def require_bool(request: dict[str, Any], key: str) -> bool:
    value = request.get(key)
    if not isinstance(value, bool):
        raise RequestError("bad_request", f'{request["op"]} needs "{key}": true or false')
    return value


# == allocators: jemalloc ============================================================================
# Types follow the jemalloc manual: bool is 1 byte, unsigned 4, size_t/ssize_t/uint64_t 8, strings
# `char *`. jemalloc copies data even when it then returns EINVAL for a wrong length, so every call's
# return code is checked. Statistics are cached until `epoch` is written: `refresh()` before reading
# `stats.*`. jemalloc cannot be dlopen'ed late (static TLS): it must be LD_PRELOADed or linked.
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
        # PyDLL keeps the GIL held during the call: mallctl takes microseconds, and releasing the GIL
        # would make the hook thread queue behind busy Python threads at every call
        function = getattr(ctypes.PyDLL(None), "mallctl", None)
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


# == allocators: tcmalloc ============================================================================
# libtcmalloc_minimal.so.4 has the MallocExtension_* functions but no heap profiler; libtcmalloc.so.4
# has both. `generic.heap_size` never shrinks: memory held is heap_size - pageheap_unmapped_bytes.
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
        lib = ctypes.PyDLL(None)  # keeps the GIL: these calls are short (see Mallctl.find)
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
        buf = ctypes.create_string_buffer(_STATS_TEXT_BYTES)
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
            free = ctypes.PyDLL(None).free
            free.argtypes = [ctypes.c_void_p]
            free.restype = None
            free(address)


def require_tcmalloc() -> Tcmalloc:
    found = Tcmalloc.find()
    if found is None:
        raise AllocatorError(
            "tcmalloc's MallocExtension API is not reachable in this process: start it with "
            "LD_PRELOAD=libtcmalloc.so.4 (or libtcmalloc_minimal.so.4)"
        )
    return found


# == allocators: glibc ===============================================================================
# `mallinfo2` (glibc >= 2.33) sums all arenas; it walks the free lists, so it costs more when the heap
# holds many free chunks. `malloc_trim(0)` returns only whole free pages inside free chunks.
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
        libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
        libc.open_memstream.restype = ctypes.c_void_p  # FILE *
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.malloc_info.restype = ctypes.c_int
        libc.fclose.argtypes = [ctypes.c_void_p]
        libc.fclose.restype = ctypes.c_int
        # the memstream buffer comes from whichever malloc serves the process: free it through the same
        self._free = ctypes.PyDLL(None).free
        self._free.argtypes = [ctypes.c_void_p]
        self._free.restype = None

    @classmethod
    def find(cls) -> GlibcMalloc | None:
        """glibc's functions, or None on a libc without `mallinfo2` (glibc < 2.33, musl)."""
        try:
            libc = ctypes.PyDLL("libc.so.6")  # keeps the GIL: see Mallctl.find
        except OSError:
            return None
        return cls(libc) if hasattr(libc, "mallinfo2") else None

    def mallinfo2(self) -> dict[str, int]:
        info = self._libc.mallinfo2()
        return {name: int(getattr(info, name)) for name in MALLINFO2_FIELDS}

    def trim(self, pad: int = 0) -> bool:
        """`malloc_trim(pad)` on every arena; True when some memory was released."""
        return bool(self._libc.malloc_trim(pad))

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


# == allocators: which one serves malloc, behind one interface =======================================
# "Mapped is not used": a library can map jemalloc while `malloc` stays glibc's, so the candidate
# (`mallctl`, `MallocExtension_GetNumericProperty`, `mallinfo2`) must live in the same object as
# `dladdr(malloc)`. Figure names (`allocated`, `active`, `resident`, `mapped`, `retained`, `metadata`,
# `free`, `purgeable`) are the same for every allocator and for the C shim (docs/allocators.md);
# figures an allocator does not have are left out, never zero.
class DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _dladdr(address: int | None) -> DlInfo | None:
    if not address:
        return None
    libc = ctypes.CDLL(None)
    libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    libc.dladdr.restype = ctypes.c_int
    info = DlInfo()
    return info if libc.dladdr(ctypes.c_void_p(address), ctypes.byref(info)) else None


def malloc_address() -> int:
    return ctypes.cast(ctypes.CDLL(None).malloc, ctypes.c_void_p).value or 0


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

    def version(self) -> str | None:
        libc = ctypes.CDLL("libc.so.6")
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        return libc.gnu_get_libc_version().decode()

    def stats(self, detail: bool = False) -> dict[str, Any]:
        info = self.malloc.mallinfo2()
        result: dict[str, Any] = {"figures": glibc_figures(info, rss_bytes()), "native": info}
        if detail:
            result["malloc_info"] = parse_malloc_info(self.malloc.info_xml()).to_dict()
        return result

    def purge(self) -> str:
        self.malloc.trim(0)
        return "malloc_trim(0)"


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


# == the Python type histogram =======================================================================
# `gc.get_objects()` lists only objects the collector tracks (containers and class instances); atomic
# objects such as `str`, `bytes` and `int` appear only when `referents=True` adds the untracked objects
# that tracked ones point to. Walking holds the GIL, so the host's threads slow down meanwhile: the
# walk refuses heaps larger than `max_objects` before it starts (estimated from
# `sys.getallocatedblocks()`, or from RSS when pymalloc is off) and stops at `budget_s`.
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


# == operations ======================================================================================
Handler = Callable[[dict[str, Any]], dict[str, Any]]


def _common(op: str) -> dict[str, Any]:
    return {
        "ok": True,
        "op": op,
        "hook": "python",
        "protocol": PROTOCOL_VERSION,
        "pid": os.getpid(),
        "ts": round(time.time(), 3),
    }


def op_ping(request: dict[str, Any]) -> dict[str, Any]:
    return {**_common("ping"), "pong": True, "allocator": local_allocator().name, "ops": list(OPS)}


def _python_figures() -> dict[str, Any]:
    import gc

    blocks = sys.getallocatedblocks()
    return {
        "version": sys.version.split()[0],
        "pymalloc": blocks > 0,
        "pymalloc_allocated_blocks": blocks,
        "pythonmalloc": os.environ.get("PYTHONMALLOC"),
        "gc_counts": list(gc.get_count()),
        "gc_collections": [generation["collections"] for generation in gc.get_stats()],
        "threads": threading.active_count(),
    }


def op_stats(request: dict[str, Any]) -> dict[str, Any]:
    detail = request.get("detail", False) is True
    allocator = local_allocator()
    return {
        **_common("stats"),
        **allocator.describe(),
        **allocator.stats(detail=detail),
        "process": process_memory(),
        "python": _python_figures(),
    }


def op_purge(request: dict[str, Any]) -> dict[str, Any]:
    import gc

    allocator = local_allocator()
    started, before = time.perf_counter(), rss_bytes()
    collected = gc.collect() if request.get("gc") is True else None
    action = allocator.purge()
    after = rss_bytes()
    return {
        **_common("purge"),
        "allocator": allocator.name,
        "action": action,
        "gc_collected": collected,
        "rss_before": before,
        "rss_after": after,
        "returned_bytes": max(0, before - after),
        "duration_s": round(time.perf_counter() - started, 6),
    }


def op_prof_dump(request: dict[str, Any]) -> dict[str, Any]:
    path = require_str(request, "path", absolute_path=True)
    allocator = local_allocator()
    result = allocator.prof_dump(path)
    return {
        **_common("prof_dump"),
        "allocator": allocator.name,
        "path": path,
        "bytes": os.path.getsize(path),
        **result,
    }


def op_prof_active(request: dict[str, Any]) -> dict[str, Any]:
    active = require_bool(request, "active")
    prefix = request.get("prefix")
    if prefix is not None:
        prefix = require_str(request, "prefix", absolute_path=True)
    allocator = local_allocator()
    return {**_common("prof_active"), "allocator": allocator.name, **allocator.prof_active(active, prefix)}


def op_histogram(request: dict[str, Any]) -> dict[str, Any]:
    result = type_histogram(
        top=optional_int(request, "top", 50, 1, 1000),
        max_objects=optional_int(request, "max_objects", 2_000_000, 1, 100_000_000),
        budget_s=optional_float(request, "budget_s", 1.0, 0.001, 10.0),
        referents=request.get("referents", False) is True,
    )
    return {**_common("histogram"), **result}


HANDLERS: dict[str, Handler] = {
    "ping": op_ping,
    "stats": op_stats,
    "purge": op_purge,
    "prof_dump": op_prof_dump,
    "prof_active": op_prof_active,
    "histogram": op_histogram,
}


def handle_line(line: bytes, handlers: dict[str, Handler] = HANDLERS) -> dict[str, Any]:
    """The reply to one request line; never raises (every failure is an error reply)."""
    try:
        request = decode_request(line)
        handler = handlers.get(request["op"])
        if handler is None:
            known = ", ".join(handlers)
            return error_reply("unknown_op", f"unknown op {request['op'][:64]!r}: known ops are {known}")
        return handler(request)
    except RequestError as exc:
        return error_reply(exc.code, str(exc))
    except AllocatorError as exc:
        return error_reply("failed", str(exc))
    except OSError as exc:
        return error_reply("failed", f"{exc.strerror or exc} ({getattr(exc, 'filename', None) or ''})")
    except Exception as exc:
        return error_reply("failed", f"{type(exc).__name__}: {str(exc)[:300]}")


# == the server ======================================================================================
MAX_CLIENTS = 8
BACKLOG = 64
IDLE_TIMEOUT_S = 10.0
_UCRED = struct.Struct("3i")


class _Client:
    __slots__ = ("buffer", "discarding", "last", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.discarding = False  # inside an over-long line: drop bytes up to its newline
        self.last = time.monotonic()


class HookServer:
    """One listening socket served by one daemon thread with a selector; see the module docstring."""

    def __init__(self, template: str, handlers: dict[str, Handler] | None = None) -> None:
        self.template = template
        self.handlers = HANDLERS if handlers is None else handlers
        self.path = expand(template, os.getpid(), os.getuid(), os.environ)
        self.owner_pid = os.getpid()
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._uids = {0, os.getuid(), os.geteuid()}

    def start(self) -> str:
        # detect the allocator now, in the starting thread: doing it on the first request would pay for
        # every file access with a GIL hand-off behind busy threads
        local_allocator()
        self._listener = bind_listener(self.path, BACKLOG)
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name="medic-hook", daemon=True)
        self._thread.start()
        return self.path

    def stop(self, unlink: bool = True) -> None:
        self._stopping = True
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if unlink and os.getpid() == self.owner_pid:
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def abandon(self) -> None:
        """In a forked child: close the inherited sockets without touching the parent's path."""
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        clients: dict[int, _Client] = {}
        assert self._listener is not None
        selector.register(self._listener, selectors.EVENT_READ, None)
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        try:
            while not self._stopping:
                try:
                    self._step(selector, clients)
                except Exception:
                    time.sleep(0.1)  # never die, never spin; the next step starts clean
        finally:
            for client in list(clients.values()):
                self._drop(selector, clients, client)
            with contextlib.suppress(Exception):
                selector.close()
            for sock in (self._listener, self._wake_r, self._wake_w):
                if sock is not None:
                    with contextlib.suppress(Exception):
                        sock.close()

    def _step(self, selector: selectors.BaseSelector, clients: dict[int, _Client]) -> None:
        events = selector.select(timeout=1.0 if clients else None)
        for key, _ in events:
            if key.fileobj is self._listener:
                self._accept(selector, clients)
            elif key.fileobj is self._wake_r:
                return
            else:
                self._read(selector, clients, key.data)
        now = time.monotonic()
        for client in list(clients.values()):
            if now - client.last > IDLE_TIMEOUT_S:
                self._drop(selector, clients, client)

    def _accept(self, selector: selectors.BaseSelector, clients: dict[int, _Client]) -> None:
        """Take every pending connection (up to the backlog), so bursts do not fill the queue."""
        for _ in range(BACKLOG):
            if not self._accept_one(selector, clients):
                return

    def _accept_one(self, selector: selectors.BaseSelector, clients: dict[int, _Client]) -> bool:
        assert self._listener is not None
        try:
            conn, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            time.sleep(0.1)  # EMFILE and friends: back off instead of spinning
            return False
        conn.setblocking(False)
        try:
            _pid, uid, _gid = _UCRED.unpack(
                conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
            )
        except OSError:
            conn.close()
            return True
        if uid not in self._uids:
            self._send_and_close(conn, error_reply("permission", f"uid {uid} may not use this hook"))
            return True
        if len(clients) >= MAX_CLIENTS:  # make room: the client idle the longest is most likely gone
            self._drop(selector, clients, min(clients.values(), key=lambda c: c.last))
        client = _Client(conn)
        clients[conn.fileno()] = client
        selector.register(conn, selectors.EVENT_READ, client)
        return True

    @staticmethod
    def _send_and_close(conn: socket.socket, reply: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            conn.send(encode(reply))
        conn.close()

    def _drop(self, selector: selectors.BaseSelector, clients: dict[int, _Client], client: _Client) -> None:
        with contextlib.suppress(Exception):
            selector.unregister(client.sock)
        clients.pop(client.sock.fileno(), None)
        with contextlib.suppress(OSError):
            client.sock.close()

    def _read(self, selector: selectors.BaseSelector, clients: dict[int, _Client], client: _Client) -> None:
        try:
            data = client.sock.recv(MAX_REQUEST_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(selector, clients, client)  # EOF: a half-sent request is discarded
            return
        client.last = time.monotonic()
        client.buffer += data
        if client.discarding:
            end = client.buffer.find(b"\n")
            if end < 0:
                client.buffer.clear()
                return
            del client.buffer[: end + 1]
            client.discarding = False
        while True:
            end = client.buffer.find(b"\n")
            if end < 0:
                break
            line = bytes(client.buffer[:end])
            del client.buffer[: end + 1]
            if not self._reply(client, handle_line(line, self.handlers)):
                self._drop(selector, clients, client)
                return
        if len(client.buffer) >= MAX_REQUEST_BYTES:  # answer now, skip the rest of the line
            reply = error_reply("too_large", f"request longer than {MAX_REQUEST_BYTES - 1} bytes")
            client.buffer.clear()
            client.discarding = True
            if not self._reply(client, reply):
                self._drop(selector, clients, client)

    @staticmethod
    def _reply(client: _Client, reply: dict[str, Any]) -> bool:
        """Send a whole reply or report failure (a client that does not read is dropped, not waited for)."""
        data = encode(reply)
        try:
            sent = client.sock.send(data)
        except OSError:
            return False
        if sent == len(data):
            return True
        # the socket buffer is full: give a slow reader a short, bounded chance
        client.sock.settimeout(1.0)
        try:
            client.sock.sendall(data[sent:])
        except OSError:
            return False
        finally:
            with contextlib.suppress(OSError):
                client.sock.setblocking(False)
        return True


# == the module-level API ============================================================================
_server: HookServer | None = None
_lock = threading.Lock()
_hooks_registered = False


def start(path: str | None = None) -> str:
    """Start the hook (idempotent) and return the socket path.

    `path` is a template (`%p` = pid, `auto` = conventional path); default `$MEDIC_HOOK_SOCKET`,
    else `auto`. Raises `FileExistsError` if another process serves the path, `SocketPathError`
    (a `ValueError`) for an unusable path, `OSError` when the socket cannot be bound.
    """
    global _server
    with _lock:
        if _server is not None and _server.owner_pid == os.getpid():
            return _server.path
        template = path or os.environ.get(ENV_SOCKET) or AUTO
        server = HookServer(template)
        server.start()
        _server = server
        _register_process_hooks()
        return server.path


def stop() -> None:
    """Stop serving and remove the socket."""
    global _server
    with _lock:
        server, _server = _server, None
    if server is not None:
        server.stop()


def running_path() -> str | None:
    server = _server
    return server.path if server is not None and server.owner_pid == os.getpid() else None


def autostart() -> str | None:
    """Start when `MEDIC_HOOK_SOCKET` is set; never raises (returns None if it did not start).

    Set `MEDIC_HOOK_DEBUG=1` to see why on stderr.
    """
    if not os.environ.get(ENV_SOCKET):
        return None
    try:
        return start()
    except Exception as exc:
        if os.environ.get(ENV_DEBUG):
            print(f"medic hook: not started: {exc}", file=sys.stderr)
        return None


def _register_process_hooks() -> None:
    """Fork and exit handlers, registered once and only by a hook that started (an import adds none)."""
    global _hooks_registered
    if not _hooks_registered:
        _hooks_registered = True
        os.register_at_fork(after_in_child=_after_fork_in_child)
        atexit.register(_at_exit)


def _after_fork_in_child() -> None:
    global _server, _lock
    _lock = threading.Lock()  # another thread may have held it at fork time
    server, _server = _server, None
    if server is None:
        return
    server.abandon()
    if has_pid(server.template):
        with contextlib.suppress(Exception):
            start(server.template)


def _at_exit() -> None:
    server = _server
    if server is not None and server.owner_pid == os.getpid():
        with contextlib.suppress(Exception):
            os.unlink(server.path)
