"""A small client of the hook protocol, used by the allocator probe, `medic purge`, `medic doctor` and
`medic hook call`. Errors are `agent.core.errors.ProbeError` subclasses that say what to do.

    with HookClient("/run/medic/hook.4242.sock", timeout=2.0, pid=4242) as hook:
        stats = hook.request("stats")

With `pid`, the client trusts a socket only when the process serving it is that pid (the kernel's
SO_PEERCRED of the listener, which a process cannot forge): a socket another user planted at the
expected path is refused as `HookNotFound` before a byte is sent or a reply believed. Without
`pid` (a path given by hand), the listener must at least run as root, as medic's user, or as the
owner of the socket file: a process of a third user serving someone else's path is refused too.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

from native_hooks import protocol, sockets
from native_hooks.errors import (
    HOOK_HOWTO,
    HookAccessDenied,
    HookNotFound,
    HookOpUnavailable,
    HookProtocolError,
    HookRequestError,
    HookTimeout,
)
from probes.linux.procfs import HOST_ROOT


class HookClient:
    """One connection to a hook socket, opened on first use and reused; not thread-safe."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        timeout: float = 2.0,
        *,
        pid: int | None = None,
        root: Path = HOST_ROOT,
    ) -> None:
        self.path = os.fspath(path)
        self.timeout = timeout
        self.pid = pid  # the target: only its own listener is trusted
        self.root = root  # the file system root whose /proc names the target
        self._sock: socket.socket | None = None
        self._buffer = bytearray()

    def __enter__(self) -> HookClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buffer.clear()

    def request(self, op: str, **params: Any) -> dict[str, Any]:
        """Send `{"op": op, **params}` and return the `{"ok": true, ...}` reply.

        Raises `HookNotFound`, `HookAccessDenied`, `HookTimeout`, `HookProtocolError`,
        `HookOpUnavailable` (code unsupported/unavailable/too_expensive) or `HookRequestError`.
        """
        line = protocol.encode({"op": op, **params})
        if len(line) > protocol.MAX_REQUEST_BYTES:
            raise HookRequestError(
                f"request {op!r} is longer than {protocol.MAX_REQUEST_BYTES} bytes", "too_large"
            )
        attempts = 2 if self._sock is not None else 1  # a reused connection may have been dropped as idle
        for attempt in range(attempts):
            try:
                reply = self._exchange(line)
                break
            except (_ClosedBeforeReply, ConnectionError) as exc:
                self.close()
                if attempt == attempts - 1:
                    raise HookProtocolError(
                        f"hook at {self.path} closed the connection without answering {op!r} ({exc or 'EOF'})"
                    ) from None
        if not reply["ok"]:
            code = str(reply.get("code", "failed"))
            message = f"hook at {self.path} refused {op!r}: {reply.get('error', 'no reason given')}"
            if code == "permission":
                raise HookAccessDenied(message)
            if code in ("unsupported", "unavailable", "too_expensive"):
                raise HookOpUnavailable(message, code)
            raise HookRequestError(message, code)
        return reply

    def _connect(self) -> socket.socket:
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return self._connect_once()
            except BlockingIOError:  # the server's backlog is full for a moment: retry until the deadline
                if time.monotonic() > deadline:
                    raise HookTimeout(
                        f"hook at {self.path} did not accept a connection within {self.timeout}s (backlog full)"
                    ) from None
                time.sleep(0.005)

    def _connect_once(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.path)
        except BlockingIOError:
            sock.close()
            raise
        except FileNotFoundError:
            sock.close()
            raise HookNotFound(f"no hook socket at {self.path}: {HOOK_HOWTO}") from None
        except ConnectionRefusedError:
            sock.close()
            raise HookNotFound(
                f"nothing listens on {self.path}: a stale socket of a process that exited or exec'd "
                "(`medic hook clean` removes it)"
            ) from None
        except PermissionError:
            sock.close()
            raise HookAccessDenied(
                f"permission denied on {self.path}: run medic as the target's user or as root"
            ) from None
        except TimeoutError:
            sock.close()
            raise HookTimeout(
                f"hook at {self.path} did not accept a connection within {self.timeout}s"
            ) from None
        except OSError as exc:
            sock.close()
            if exc.errno == errno.ENOTSOCK or exc.errno == errno.ENOTDIR:
                raise HookNotFound(f"{self.path} is not a hook socket ({exc.strerror})") from None
            raise HookNotFound(f"cannot connect to hook socket {self.path}: {exc.strerror or exc}") from None
        try:
            if self.pid is not None:
                self._check_peer(sock, self.pid)
            else:
                self._check_peer_uid(sock)
        except BaseException:
            sock.close()
            raise
        return sock

    def _check_peer_uid(self, sock: socket.socket) -> None:
        """Refuse a listener that runs as neither root, medic's user, nor the socket file's owner."""
        peer_pid, peer_uid, _gid = _UCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        )
        try:
            owner: int | None = os.stat(self.path).st_uid
        except OSError:
            owner = None  # replaced or removed since connect(): trust nobody but root and medic
        if peer_uid in (0, os.geteuid(), owner):
            return
        raise HookNotFound(
            f"hook at {self.path} is served by pid {peer_pid} as uid {peer_uid} (per SO_PEERCRED), "
            f"while the socket file belongs to uid {owner}: medic does not trust its replies; "
            "check who created it, or name the target's pid (`--pid PID`) so that medic checks the process serving it"
        )

    def _check_peer(self, sock: socket.socket, pid: int) -> None:
        """Refuse a listener that is not `pid` (as seen from medic's pid namespace, or any of its own)."""
        peer_pid, peer_uid, _gid = _UCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        )
        if peer_pid not in sockets.namespace_pids(pid, self.root):
            raise HookNotFound(
                f"hook at {self.path} belongs to pid {peer_pid} (uid {peer_uid}, per SO_PEERCRED), "
                f"not to pid {pid}: "
                "medic does not trust its replies; check who created it, and put %p in MEDIC_HOOK_SOCKET "
                "so that each process gets its own"
            )

    def _exchange(self, line: bytes) -> dict[str, Any]:
        if self._sock is None:
            self._sock = self._connect()
            self._buffer.clear()
        deadline = time.monotonic() + self.timeout
        try:
            try:
                self._sock.sendall(line)
            except ConnectionError:
                raw = self._refusal()  # the hook refused us (peer uid) and closed before our write
                if raw is None:
                    raise
                return protocol.decode_reply(raw, self.path)
            raw = self._read_line(deadline)
        except TimeoutError:
            self.close()
            raise HookTimeout(
                f"hook at {self.path} did not answer within {self.timeout}s (the target may be stopped or swapping)"
            ) from None
        except ConnectionError:
            raise
        except OSError as exc:
            self.close()
            raise HookProtocolError(f"talking to hook at {self.path} failed: {exc.strerror or exc}") from None
        return protocol.decode_reply(raw, self.path)

    def _refusal(self) -> bytes | None:
        """A reply line the server sent before closing, if one is waiting."""
        assert self._sock is not None
        try:
            self._sock.setblocking(False)
            data = self._sock.recv(65536)
        except OSError:
            return None
        line, sep, _ = data.partition(b"\n")
        return line if sep else None

    def _read_line(self, deadline: float) -> bytes:
        assert self._sock is not None
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                return line
            if len(self._buffer) > protocol.MAX_REPLY_BYTES:
                self.close()
                raise HookProtocolError(
                    f"hook at {self.path} sent a reply over {protocol.MAX_REPLY_BYTES} bytes"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            self._sock.settimeout(remaining)
            chunk = self._sock.recv(65536)
            if not chunk:
                if self._buffer:
                    self.close()
                    raise HookProtocolError(f"hook at {self.path} closed the connection mid-reply")
                raise _ClosedBeforeReply
            self._buffer += chunk


_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid


class _ClosedBeforeReply(Exception):
    """The server closed the connection before sending a byte (idle timeout)."""


def request(path: str | os.PathLike[str], op: str, timeout: float = 2.0, **params: Any) -> dict[str, Any]:
    """One request on a fresh connection."""
    with HookClient(path, timeout) as client:
        return client.request(op, **params)
