"""Native hooks: ctypes bindings to jemalloc, tcmalloc and glibc, the in-process hook for Python
targets, the LD_PRELOAD shim for native targets, and the client medic talks to them with.

Kept import-light: a target that autostarts the hook imports this package at interpreter start.
"""

from __future__ import annotations


def shim_path() -> str:
    """Absolute path of the built LD_PRELOAD shim (`libmedic_shim.so`); raises `ShimNotBuilt`."""
    from native_hooks.shim import shim_path as _shim_path

    return _shim_path()
