"""The errors raised inside the hook; `medic_hook.handlers` turns each into an `{"ok": false}` reply.

Exception
├── RequestError        a request the hook cannot serve; `code` goes into the reply
├── AllocatorError      an allocator call failed (errno, missing symbol, bad output): code "failed"
│   └── MallctlError    jemalloc's mallctl returned an errno
└── ValueError
    └── SocketPathError a socket template that cannot be used (raised by `start`)
"""

from __future__ import annotations


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
