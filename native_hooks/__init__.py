"""Native hooks: ctypes bindings to jemalloc, tcmalloc and glibc, the in-process hook for Python
targets, the LD_PRELOAD shim for native targets, and heap-profile parsers."""
