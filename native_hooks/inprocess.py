"""The in-process hook for Python targets: a daemon thread answering the hook protocol on a Unix socket.

    import native_hooks.inprocess
    native_hooks.inprocess.start()              # MEDIC_HOOK_SOCKET, else "auto": <dir>/hook.<pid>.sock
    native_hooks.inprocess.start("/run/medic/api.%p.sock")

or, with no code change, `MEDIC_HOOK_SOCKET=auto` plus `import native_hooks.autostart` from a `.pth`
file (`medic hook install-pth`). The thread never raises into the host: every failure becomes an
error reply. Work per request is bounded (request line <= 4 KiB, histogram walk within a budget),
at most 8 connections are kept (a new one evicts the one idle the longest), idle ones are dropped
after 10 s, and peers must run with
our uid or as root (SO_PEERCRED). After `os.fork()` a child whose path has the pid in it (`%p` or
`auto`) serves its own socket; otherwise it serves none. The socket is removed at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from native_hooks import protocol, sockets

MAX_CLIENTS = 8
BACKLOG = 64
IDLE_TIMEOUT_S = 10.0
_UCRED = struct.Struct("3i")

Handler = Callable[[dict[str, Any]], dict[str, Any]]


# -- operations ----------------------------------------------------------------------------------
def _allocator():
    from native_hooks.allocator import local_allocator

    return local_allocator()


def _common(op: str) -> dict[str, Any]:
    return {
        "ok": True,
        "op": op,
        "hook": "python",
        "protocol": protocol.PROTOCOL_VERSION,
        "pid": os.getpid(),
        "ts": round(time.time(), 3),
    }


def op_ping(request: dict[str, Any]) -> dict[str, Any]:
    return {**_common("ping"), "pong": True, "allocator": _allocator().name, "ops": list(protocol.OPS)}


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
    from native_hooks.allocator import process_memory

    detail = request.get("detail", False) is True
    allocator = _allocator()
    return {
        **_common("stats"),
        **allocator.describe(),
        **allocator.stats(detail=detail),
        "process": process_memory(),
        "python": _python_figures(),
    }


def op_purge(request: dict[str, Any]) -> dict[str, Any]:
    import gc

    from native_hooks.allocator import rss_bytes

    allocator = _allocator()
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
    path = protocol.require_str(request, "path", absolute_path=True)
    allocator = _allocator()
    result = allocator.prof_dump(path)
    return {
        **_common("prof_dump"),
        "allocator": allocator.name,
        "path": path,
        "bytes": os.path.getsize(path),
        **result,
    }


def op_prof_active(request: dict[str, Any]) -> dict[str, Any]:
    active = protocol.require_bool(request, "active")
    prefix = request.get("prefix")
    if prefix is not None:
        prefix = protocol.require_str(request, "prefix", absolute_path=True)
    allocator = _allocator()
    return {**_common("prof_active"), "allocator": allocator.name, **allocator.prof_active(active, prefix)}


def op_histogram(request: dict[str, Any]) -> dict[str, Any]:
    from native_hooks.histogram import type_histogram

    result = type_histogram(
        top=protocol.optional_int(request, "top", 50, 1, 1000),
        max_objects=protocol.optional_int(request, "max_objects", 2_000_000, 1, 100_000_000),
        budget_s=protocol.optional_float(request, "budget_s", 1.0, 0.001, 10.0),
        referents=request.get("referents", False) is True,
    )
    return {**_common("histogram"), **result}


def _warm_up() -> None:
    """Import what the handlers need and detect the allocator now, in the starting thread: doing it on
    the first request would pay for every file access with a GIL hand-off behind busy threads."""
    import native_hooks.histogram  # noqa: F401

    _allocator()


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
    from agent.errors import MedicError
    from native_hooks.errors import HookOpUnavailable, HookRequestError

    try:
        request = protocol.decode_request(line)
        handler = handlers.get(request["op"])
        if handler is None:
            known = ", ".join(handlers)
            return protocol.error_reply(
                "unknown_op", f"unknown op {request['op'][:64]!r}: known ops are {known}"
            )
        return handler(request)
    except protocol.RequestError as exc:
        return protocol.error_reply(exc.code, str(exc))
    except HookOpUnavailable as exc:
        return protocol.error_reply(exc.code, str(exc))
    except HookRequestError as exc:
        return protocol.error_reply(exc.code, str(exc))
    except MedicError as exc:
        return protocol.error_reply("failed", str(exc))
    except OSError as exc:
        return protocol.error_reply(
            "failed", f"{exc.strerror or exc} ({getattr(exc, 'filename', None) or ''})"
        )
    except Exception as exc:
        return protocol.error_reply("failed", f"{type(exc).__name__}: {str(exc)[:300]}")


# -- the server ------------------------------------------------------------------------------------
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
        self.path = sockets.expand(template, os.getpid(), os.getuid(), os.environ)
        self.owner_pid = os.getpid()
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._uids = {0, os.getuid(), os.geteuid()}

    def start(self) -> str:
        _warm_up()
        self._listener = sockets.bind_listener(self.path, BACKLOG)
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
            self._send_and_close(conn, protocol.error_reply("permission", f"uid {uid} may not use this hook"))
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
            conn.send(protocol.encode(reply))
        conn.close()

    def _drop(self, selector: selectors.BaseSelector, clients: dict[int, _Client], client: _Client) -> None:
        with contextlib.suppress(Exception):
            selector.unregister(client.sock)
        clients.pop(client.sock.fileno(), None)
        with contextlib.suppress(OSError):
            client.sock.close()

    def _read(self, selector: selectors.BaseSelector, clients: dict[int, _Client], client: _Client) -> None:
        try:
            data = client.sock.recv(protocol.MAX_REQUEST_BYTES)
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
        if len(client.buffer) >= protocol.MAX_REQUEST_BYTES:  # answer now, skip the rest of the line
            reply = protocol.error_reply(
                "too_large", f"request longer than {protocol.MAX_REQUEST_BYTES - 1} bytes"
            )
            client.buffer.clear()
            client.discarding = True
            if not self._reply(client, reply):
                self._drop(selector, clients, client)

    @staticmethod
    def _reply(client: _Client, reply: dict[str, Any]) -> bool:
        """Send a whole reply or report failure (a client that does not read is dropped, not waited for)."""
        data = protocol.encode(reply)
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


# -- module-level API ------------------------------------------------------------------------------
_server: HookServer | None = None
_lock = threading.Lock()


def start(path: str | None = None) -> str:
    """Start the hook (idempotent) and return the socket path.

    `path` is a template (`%p` = pid, `auto` = conventional path); default `$MEDIC_HOOK_SOCKET`,
    else `auto`. Raises `FileExistsError` if another process serves the path, `ValueError`
    (`SocketPathError`) for an unusable path, `OSError` when the socket cannot be bound.
    """
    global _server
    with _lock:
        if _server is not None and _server.owner_pid == os.getpid():
            return _server.path
        template = path or os.environ.get(sockets.ENV_SOCKET) or sockets.AUTO
        server = HookServer(template)
        server.start()
        _server = server
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
    if not os.environ.get(sockets.ENV_SOCKET):
        return None
    try:
        return start()
    except Exception as exc:
        if os.environ.get("MEDIC_HOOK_DEBUG"):
            print(f"medic hook: not started: {exc}", file=sys.stderr)
        return None


def _after_fork_in_child() -> None:
    global _server, _lock
    _lock = threading.Lock()  # another thread may have held it at fork time
    server, _server = _server, None
    if server is None:
        return
    server.abandon()
    if sockets.has_pid(server.template):
        with contextlib.suppress(Exception):
            start(server.template)


def _at_exit() -> None:
    server = _server
    if server is not None and server.owner_pid == os.getpid():
        with contextlib.suppress(Exception):
            os.unlink(server.path)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
