"""A small client of the hook protocol, used by the allocator probe, `medic purge`, `medic doctor` and
`medic hook call`. Errors are `agent.errors.ProbeError` subclasses that say what to do.

    with HookClient("/run/medic/hook.4242.sock", timeout=2.0) as hook:
        stats = hook.request("stats")
"""

from __future__ import annotations

import errno
import os
import socket
import time
from typing import Any

from native_hooks import protocol
from native_hooks.errors import (
    HOOK_HOWTO,
    HookAccessDenied,
    HookNotFound,
    HookOpUnavailable,
    HookProtocolError,
    HookRequestError,
    HookTimeout,
)


class HookClient:
    """One connection to a hook socket, opened on first use and reused; not thread-safe."""

    def __init__(self, path: str | os.PathLike[str], timeout: float = 2.0) -> None:
        self.path = os.fspath(path)
        self.timeout = timeout
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
        return sock

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


class _ClosedBeforeReply(Exception):
    """The server closed the connection before sending a byte (idle timeout)."""


def request(path: str | os.PathLike[str], op: str, timeout: float = 2.0, **params: Any) -> dict[str, Any]:
    """One request on a fresh connection."""
    with HookClient(path, timeout) as client:
        return client.request(op, **params)
