"""Where the built LD_PRELOAD shim is: `libmedic_shim.so`, a plain C library that setup.py compiles from
shim.c next to this module (no interpreter suffix: one file for every Python version)."""

from __future__ import annotations

from pathlib import Path

from native_hooks.errors import ShimNotBuilt

SHIM_STEM = "libmedic_shim"


def shim_path() -> str:
    """Absolute path of the shim library; raises `ShimNotBuilt` with the command that builds it."""
    here = Path(__file__).resolve().parent
    path = here / f"{SHIM_STEM}.so"
    if path.is_file():
        return str(path)
    raise ShimNotBuilt(
        f"the LD_PRELOAD shim is not built (no {SHIM_STEM}.so in {here}): reinstall with `pip install .` "
        "(or `pip install -e .`, or `python setup.py build_ext --inplace` in a checkout); "
        "it needs a C compiler (Debian package gcc)"
    )
