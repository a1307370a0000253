"""Native hooks, medic's side: the LD_PRELOAD shim for native targets, the client medic talks to the
hooks with, socket discovery, heap-profile parsing. What runs inside Python targets (the in-process
hook, the ctypes allocator bindings, the protocol rules) is the top-level package `medic_hook`, which
imports nothing of this package; the modules here re-export its shared pieces.
"""

from __future__ import annotations


def shim_path() -> str:
    """Absolute path of the built LD_PRELOAD shim (`libmedic_shim.so`); raises `ShimNotBuilt`."""
    from native_hooks.shim import shim_path as _shim_path

    return _shim_path()
