"""Former autostart entry point, kept for `medic-hook.pth` files written by older versions of medic
(`import native_hooks.autostart`): it starts `medic_hook` when `MEDIC_HOOK_SOCKET` is set and never
raises. Re-run `medic hook install-pth` to replace that line with one that imports only `medic_hook`.
"""

from __future__ import annotations

import os

if os.environ.get("MEDIC_HOOK_SOCKET"):
    try:
        import medic_hook

        medic_hook.autostart()
    except Exception:  # an import problem must not stop the host's start-up
        if os.environ.get("MEDIC_HOOK_DEBUG"):
            import traceback

            traceback.print_exc()
