"""Former home of the in-process hook, kept so that programs which call
`native_hooks.inprocess.start()` keep starting: everything is `medic_hook`'s. Use `import medic_hook;
medic_hook.start()` instead; this name pulls the `native_hooks` package into the target.
"""

from __future__ import annotations

from medic_hook import (
    BACKLOG,
    HANDLERS,
    IDLE_TIMEOUT_S,
    MAX_CLIENTS,
    Handler,
    HookServer,
    autostart,
    handle_line,
    running_path,
    start,
    stop,
)

__all__ = [
    "BACKLOG",
    "HANDLERS",
    "IDLE_TIMEOUT_S",
    "MAX_CLIENTS",
    "Handler",
    "HookServer",
    "autostart",
    "handle_line",
    "running_path",
    "start",
    "stop",
]
