"""The hook's server: one listening socket served by one daemon thread with a selector.

Work per request is bounded (request line <= 4 KiB), at most 8 connections are kept (a new one evicts
the one idle the longest), idle ones are dropped after 10 s, and peers must run with our uid or as root
(SO_PEERCRED). The thread never dies and never raises into the host.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
import struct
import threading
import time
from typing import Any

from medic_hook import sites
from medic_hook.allocator import local_allocator
from medic_hook.handlers import HANDLERS, Handler, handle_line
from medic_hook.paths import bind_listener, expand
from medic_hook.protocol import MAX_REQUEST_BYTES, encode, error_reply

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
        assert self._listener is not None and self._wake_r is not None
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
        timeout = 1.0 if clients else None
        budget = sites.enforce_budget()  # tracing allocations stops itself here: no thread of its own
        if budget is not None:
            timeout = budget if timeout is None else min(timeout, budget)
        events = selector.select(timeout=timeout)
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
