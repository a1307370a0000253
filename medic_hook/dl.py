"""ctypes handles on this process's C symbols, opened once and kept for the life of the hook.

Every `ctypes.CDLL(...)` builds a new function-pointer class, and each symbol looked up on it another
function object: made per request they pile up in the host as garbage (cycles only a full collection
frees) and show among its top types. Everything of the hook that calls C goes through these two.
`PyDLL` keeps the GIL during calls: the calls are microseconds, and releasing the GIL would make the
hook thread queue behind busy Python threads at every call.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def process_symbols() -> ctypes.PyDLL:
    """The global symbol scope of this process (`dlopen(NULL)`): malloc, free, mallctl, dladdr, ..."""
    return ctypes.PyDLL(None)


@lru_cache(maxsize=1)
def libc() -> ctypes.PyDLL | None:
    """glibc itself (`libc.so.6`), or None on a libc of another name (musl)."""
    try:
        return ctypes.PyDLL("libc.so.6")
    except OSError:
        return None


@lru_cache(maxsize=1)
def free_function() -> Any:
    """`free` of whichever malloc serves the process (buffers that libc or tcmalloc malloc'ed for us)."""
    function = process_symbols().free
    function.argtypes = [ctypes.c_void_p]
    function.restype = None
    return function
