"""Where the built LD_PRELOAD shim is (`libmedic_shim*.so`, compiled from shim.c by the package build)."""

from __future__ import annotations

import importlib.machinery
from pathlib import Path

from native_hooks.errors import ShimNotBuilt

SHIM_STEM = "libmedic_shim"


def shim_path() -> str:
    """Absolute path of the shim library; raises `ShimNotBuilt` with the command that builds it."""
    here = Path(__file__).resolve().parent
    for suffix in (*importlib.machinery.EXTENSION_SUFFIXES, ".so"):
        path = here / f"{SHIM_STEM}{suffix}"
        if path.is_file():
            return str(path)
    raise ShimNotBuilt(
        f"the LD_PRELOAD shim is not built (no {SHIM_STEM}*.so in {here}): reinstall with `pip install .` "
        "(or `pip install -e .`, or `python setup.py build_ext --inplace` in a checkout); "
        "it needs a C compiler (Debian package gcc)"
    )
