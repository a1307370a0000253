"""Start the in-process hook at interpreter start when `MEDIC_HOOK_SOCKET` is set; otherwise do nothing.

Meant for a one-line `.pth` file in site-packages (`medic hook install-pth` writes it):

    import native_hooks.autostart

Python runs `import` lines of `.pth` files at start-up, before the program. Without the variable
this costs one small import; with it, a daemon thread serves the hook socket. It never raises:
set `MEDIC_HOOK_DEBUG=1` to see on stderr why a hook did not start.
"""

from __future__ import annotations

import os

if os.environ.get("MEDIC_HOOK_SOCKET"):
    try:
        from native_hooks.inprocess import autostart as _autostart

        _autostart()
    except Exception:  # an import problem must not stop the host's start-up
        if os.environ.get("MEDIC_HOOK_DEBUG"):
            import traceback

            traceback.print_exc()
