"""gperftools tcmalloc's C API (`MallocExtension_*`, `HeapProfiler*`) through ctypes: `medic_hook`'s,
re-exported (the bindings run inside targets, so they live in the hook's package).
"""

from __future__ import annotations

from medic_hook.tcmalloc import TCMALLOC_PROPERTIES as PROPERTIES
from medic_hook.tcmalloc import Tcmalloc
from medic_hook.tcmalloc import require_tcmalloc as require

__all__ = ["PROPERTIES", "Tcmalloc", "require"]
