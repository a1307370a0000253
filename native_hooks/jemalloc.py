"""jemalloc's `mallctl` through ctypes: `medic_hook`'s, re-exported (the bindings run inside targets, so
they live in the hook's package).
"""

from __future__ import annotations

from medic_hook.jemalloc import JEMALLOC_STATS as STATS
from medic_hook.jemalloc import MALLCTL_ARENAS_ALL, Mallctl
from medic_hook.jemalloc import require_jemalloc as require

__all__ = ["MALLCTL_ARENAS_ALL", "STATS", "Mallctl", "require"]
