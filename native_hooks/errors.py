"""Errors of the hook client (medic's side), inside `agent.core.errors`. Those of the allocator
bindings (`AllocatorError`, `MallctlError`) run inside targets and so belong to `medic_hook.errors`
(plain `Exception`s there, turned into `{"ok": false}` replies before they reach medic).

ProbeError
├── HookError                 a hook answered badly or too late
│   ├── HookTimeout
│   ├── HookProtocolError     the reply was not one JSON object on one line
│   └── HookRequestError      the hook answered {"ok": false, "code", "error"}
├── ProbeUnavailable
│   ├── HookNotFound          no socket, or nothing listens on it
│   ├── HookOpUnavailable     the hook or its allocator cannot do this (code unsupported/unavailable)
│   └── ShimNotBuilt          the LD_PRELOAD shim was not compiled
└── ProbeAccessDenied
    └── HookAccessDenied      the socket or the hook refused us (permissions, peer uid)
"""

from __future__ import annotations

from agent.core.errors import ProbeAccessDenied, ProbeError, ProbeUnavailable

__all__ = [
    "HOOK_HOWTO",
    "HookAccessDenied",
    "HookError",
    "HookNotFound",
    "HookOpUnavailable",
    "HookProtocolError",
    "HookRequestError",
    "HookTimeout",
    "ShimNotBuilt",
]

HOOK_HOWTO = (
    "native targets: start them with LD_PRELOAD=$(medic hook path) MEDIC_HOOK_SOCKET=auto; "
    "Python targets: MEDIC_HOOK_SOCKET=auto and `medic hook install-pth` once per environment, or "
    "PYTHONPATH=DIR/python after `medic hook install DIR --python` for one of another image "
    "(see docs/allocators.md; `medic doctor` says what a target lacks)"
)


class HookError(ProbeError):
    """A hook socket answered badly or not at all."""


class HookTimeout(HookError):
    reason = "timeout"


class HookProtocolError(HookError):
    """A request or a reply broke the one-JSON-object-per-line protocol."""


class HookRequestError(HookError):
    """The hook understood the request and refused or failed it."""

    def __init__(self, message: str, code: str = "failed") -> None:
        super().__init__(message)
        self.code = code


class HookNotFound(ProbeUnavailable):
    """No hook socket for the target, or a stale one nobody listens on."""


class HookOpUnavailable(ProbeUnavailable):
    """The hook cannot do this here (e.g. heap profiles under glibc, profiling not enabled)."""

    def __init__(self, message: str, code: str = "unavailable") -> None:
        super().__init__(message)
        self.code = code


class ShimNotBuilt(ProbeUnavailable):
    """The LD_PRELOAD shim library is missing from the installed package."""


class HookAccessDenied(ProbeAccessDenied):
    """The socket's permissions or the hook's peer-uid check refused us."""
