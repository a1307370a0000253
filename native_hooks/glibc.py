"""The glibc allocator settings of the agent's own process, through `medic_hook.glibc`'s bindings
(which run inside targets, so they live in the hook's package).
"""

from __future__ import annotations

import logging
import os

from medic_hook.glibc import GlibcMalloc

log = logging.getLogger(__name__)

# malloc.h's mallopt parameters
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
# a block this large or larger gets its own mapping, returned to the kernel when freed, and free space
# above this much at the top of the heap is trimmed
AGENT_RETURN_THRESHOLD = 128 * 1024
# each setting, with the environment variable through which an operator sets it instead
AGENT_SETTINGS = (
    (M_ARENA_MAX, 1, "MALLOC_ARENA_MAX"),
    (M_MMAP_THRESHOLD, AGENT_RETURN_THRESHOLD, "MALLOC_MMAP_THRESHOLD_"),
    (M_TRIM_THRESHOLD, AGENT_RETURN_THRESHOLD, "MALLOC_TRIM_THRESHOLD_"),
)


def tune_agent_allocator() -> bool:
    """Keep the agent's own C heap small over a long run; called first thing in `medic run`, before any
    thread starts. One arena: the agent's threads mostly hold the GIL, so a per-thread arena (up to 8
    per core, each keeping its own free pages) buys no parallelism. A fixed 128 KiB mmap threshold:
    glibc would otherwise raise it after each freed large block, so the per-tick buffers (a `/metrics`
    page and its gzip, a probe tick's reads, a flush's batch) would stay in the heap as its high-water
    mark. A setting an operator gave through glibc's environment variable is left as given. On another
    libc (musl) or a glibc without `mallinfo2`, nothing is changed. True when the settings were applied."""
    glibc = GlibcMalloc.find()
    if glibc is None:
        log.debug("not glibc (or glibc older than 2.33): the allocator keeps its defaults")
        return False
    for param, value, variable in AGENT_SETTINGS:
        if variable in os.environ:
            continue
        if not glibc.mallopt(param, value):
            log.debug("glibc refused mallopt(%d, %d)", param, value)
    return True
