"""Native targets for the tests: the sample programs built once per module, and started with their
stdin/stdout piped so that a test drives them line by line (support.workloads.TargetIO)."""

from __future__ import annotations

import os
import subprocess

from support.procs import SpawnFn
from support.workloads import (
    TargetIO,
    build_c_target,
    build_library_needing_jemalloc,
    build_static_jemalloc,
)


def build_native_bins(out: str | os.PathLike[str]) -> dict[str, str]:
    """The programs the native tests start, built into `out`: `target` (alloc_target.c), jemalloc
    linked in statically (`static`, `stripped`, and `rdynamic`, which exports `mallctl`), and
    `libfoo`, a library that maps jemalloc without serving malloc."""
    return {
        "target": build_c_target(out),
        "static": build_static_jemalloc(out, "static_je"),
        "stripped": build_static_jemalloc(out, "static_je_stripped", strip=True),
        "rdynamic": build_static_jemalloc(out, "static_je_rdyn", rdynamic=True),
        "libfoo": build_library_needing_jemalloc(out),
    }


def start_target(spawn: SpawnFn, argv: list[str], env: dict[str, str]) -> TargetIO:
    """Start `argv` under `env` (reaped by the `spawn` fixture) once it has printed its `ready` line."""
    return TargetIO(spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))
