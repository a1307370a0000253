"""medic's in-process hook for Python targets: a daemon thread answering the hook protocol on a Unix socket.

    import medic_hook
    medic_hook.start()                          # MEDIC_HOOK_SOCKET, else "auto": <dir>/hook.<pid>.sock
    medic_hook.start("/run/medic/api.%p.sock")

or, with no code change, `MEDIC_HOOK_SOCKET=auto` plus the line that `medic hook install-pth` writes
into a `.pth` file of the target's site-packages (it calls `medic_hook.autostart()`).

This package is all of medic that ever runs inside a target. It imports only the standard library
and itself, never any of medic's other packages (`agent`, `probes`, `native_hooks`, ...), so a target
with modules of the same names keeps its own. It leaves behind only its server thread (a daemon named
`medic-hook`), its socket (removed at exit) and a few ctypes handles opened once; a request allocates
nothing that outlives its reply, and a tracemalloc session it starts stops itself within its budgets. The thread never raises into the host: every failure
becomes an error reply (`medic_hook.errors` draws the exception tree). Work per request is bounded
(request line <= 4 KiB, histogram walk within a budget), at most 8 connections are kept, idle ones are
dropped after 10 s, and peers must run with our uid or as root (SO_PEERCRED). After `os.fork()` a
child whose path has the pid in it (`%p` or `auto`) serves its own socket; otherwise it serves none.

Modules: `paths` (socket rules and safe binding), `protocol` (request and reply rules), `jemalloc`,
`tcmalloc`, `glibc` (ctypes bindings), `dl` (the ctypes handles, opened once), `allocator` (which one
serves malloc, behind one interface), `histogram` (the Python type histogram), `sites` (allocation
sites through tracemalloc), `handlers` (one per op), `server` (the thread); this module
holds the process-wide API: `start`, `stop`, `running_path`, `autostart`.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading

from medic_hook import sites
from medic_hook.errors import AllocatorError, MallctlError, RequestError, SocketPathError
from medic_hook.handlers import HANDLERS, Handler, handle_line
from medic_hook.paths import AUTO, ENV_DEBUG, ENV_SOCKET, has_pid
from medic_hook.server import BACKLOG, IDLE_TIMEOUT_S, MAX_CLIENTS, HookServer

__all__ = [
    "BACKLOG",
    "HANDLERS",
    "IDLE_TIMEOUT_S",
    "MAX_CLIENTS",
    "AllocatorError",
    "Handler",
    "HookServer",
    "MallctlError",
    "RequestError",
    "SocketPathError",
    "autostart",
    "handle_line",
    "running_path",
    "start",
    "stop",
]

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
    sites.stop("the hook stopped")


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
    sites.after_fork_in_child()
    if has_pid(server.template):
        with contextlib.suppress(Exception):
            start(server.template)


def _at_exit() -> None:
    server = _server
    if server is not None and server.owner_pid == os.getpid():
        with contextlib.suppress(Exception):
            os.unlink(server.path)
