"""The allocator libraries medic knows how to LD_PRELOAD, by the name `medic hook` and the tests use.

The sonames are those of the Debian packages libjemalloc2, libgoogle-perftools4 and
libtcmalloc-minimal4; `glibc` needs no preload.
"""

from __future__ import annotations

PRELOADS: dict[str, str | None] = {
    "glibc": None,
    "jemalloc": "libjemalloc.so.2",
    "tcmalloc": "libtcmalloc.so.4",
    "tcmalloc_minimal": "libtcmalloc_minimal.so.4",
}
