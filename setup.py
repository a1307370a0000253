"""Builds the two native parts with the system C compiler; everything else lives in pyproject.toml.

- `native_hooks/libmedic_shim.so`, the LD_PRELOAD shim: a plain shared library (no Python symbols,
  links only libdl and libpthread), so it is compiled and linked as a C library, not as a CPython
  extension, and its name carries no interpreter suffix: the same file serves every Python version.
- `agent/detect/_kernels`, the trend test's O(n^2) loops (and the slow replay's screen, the bucket
  quantiles, the export scan of `medic analyze`): a CPython extension, optional. Without a
  compiler (or with a failing one) the install still succeeds, with a warning, and
  `agent.detect.trend` uses its Python twins. It is compiled against the limited C API of the oldest
  supported CPython (`Py_LIMITED_API`, named `_kernels.abi3.so`) and the wheel is tagged
  `cp310-abi3`: one wheel per platform serves every supported Python. A free-threaded interpreter
  has no stable ABI yet; there it is built for that interpreter alone.

A missing compiler leaves the shim out too, with a warning: `medic hook path` then says how to
build it. `pip install .` puts both in the installed packages; `pip install -e .` and
`python setup.py build_ext --inplace` put them next to their sources.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SHIM_SOURCE = "native_hooks/shim.c"
SHIM_LIBRARY = "libmedic_shim.so"
SHIM_FLAGS = ["-O2", "-fPIC", "-fvisibility=hidden", "-Wall", "-Wextra", "-std=gnu11"]

# requires-python's floor (pyproject.toml): the limited API of this version, and the wheel's tag
OLDEST_PYTHON = (3, 10)
STABLE_ABI = not sysconfig.get_config_var("Py_GIL_DISABLED")
LIMITED_API_MACRO = ("Py_LIMITED_API", f"0x{OLDEST_PYTHON[0]:02X}{OLDEST_PYTHON[1]:02X}0000")
WHEEL_PYTHON_TAG = f"cp{OLDEST_PYTHON[0]}{OLDEST_PYTHON[1]}"


def _warn(message: str) -> None:
    print(f"WARNING: {message}", file=sys.stderr)


class build_native(build_ext):
    """build_ext that tolerates a missing compiler and builds the shim as a plain C library."""

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # CompileError, LinkError, a compiler that is not there
            _warn(
                f"{ext.name} was not built ({exc}); medic uses the Python fallback, slower for long "
                "series. Install a C compiler (Debian: gcc) and reinstall to get it."
            )

    def _drop_shadowing_builds(self, ext: Extension) -> None:
        """An older in-place build named for one interpreter (`_kernels.cpython-311-….so`) would be
        imported before the fresh `_kernels.abi3.so`: remove it."""
        package, _, name = ext.name.rpartition(".")
        folder = Path(self.get_finalized_command("build_py").get_package_dir(package))
        fresh = folder / Path(self.get_ext_filename(ext.name)).name
        if not fresh.exists():  # not built this time: what was there stays
            return
        for other in folder.glob(f"{name}.*.so"):
            if other != fresh:
                self.announce(f"removing {other}, shadowed by {fresh.name}", level=2)
                other.unlink()

    def run(self) -> None:
        super().run()
        if self.inplace:
            for ext in self.extensions:
                self._drop_shadowing_builds(ext)
        self.build_shim()

    def _shim_paths(self) -> tuple[Path, Path]:
        """Where the shim is linked (the build tree), and where an in-place build puts it."""
        package_dir = Path(self.get_finalized_command("build_py").get_package_dir("native_hooks"))
        return Path(self.build_lib) / "native_hooks" / SHIM_LIBRARY, package_dir / SHIM_LIBRARY

    def build_shim(self) -> None:
        built, inplace = self._shim_paths()
        try:
            objects = self.compiler.compile(
                [SHIM_SOURCE], output_dir=self.build_temp, extra_postargs=SHIM_FLAGS
            )
            built.parent.mkdir(parents=True, exist_ok=True)
            self.compiler.link_shared_object(objects, str(built), libraries=["dl", "pthread"])
        except Exception as exc:
            _warn(
                f"the LD_PRELOAD shim ({SHIM_LIBRARY}) was not built ({exc}); native targets cannot "
                "be hooked (`medic hook path` says how to build it). Install a C compiler (Debian: gcc)."
            )
            return
        if self.inplace:
            self.copy_file(str(built), str(inplace), level=self.verbose)

    def get_outputs(self) -> list[str]:
        built, inplace = self._shim_paths()
        shim = inplace if self.inplace else built
        return [*super().get_outputs(), *([str(shim)] if shim.exists() else [])]

    def get_output_mapping(self) -> dict[str, str]:
        mapping = dict(super().get_output_mapping())
        built, inplace = self._shim_paths()
        if self.inplace and built.exists():
            mapping[os.fspath(built)] = os.fspath(inplace)
        return mapping


setup(
    cmdclass={"build_ext": build_native},
    ext_modules=[
        Extension(
            "agent.detect._kernels",
            sources=["agent/detect/_kernels.c"],
            extra_compile_args=[
                "-O2",
                "-Wall",
                "-Wextra",
                "-std=gnu11",
                "-ffp-contract=off",
                "-Werror=implicit-function-declaration",  # a call outside the limited API fails the build
            ],
            define_macros=[LIMITED_API_MACRO] if STABLE_ABI else [],
            py_limited_api=STABLE_ABI,
            optional=True,
        ),
    ],
    options={"bdist_wheel": {"py_limited_api": WHEEL_PYTHON_TAG}} if STABLE_ABI else {},
)
