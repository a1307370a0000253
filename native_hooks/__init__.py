"""Native hooks, medic's side: the LD_PRELOAD shim for native targets, the client medic talks to the
hooks with, socket discovery, heap-profile parsing. What runs inside Python targets (the in-process
hook, the ctypes allocator bindings, the protocol rules) is the top-level package `medic_hook`, which
imports nothing of this package; medic's tools import its pieces from there.
"""
