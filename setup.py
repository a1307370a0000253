"""Builds the LD_PRELOAD shim (`native_hooks/libmedic_shim*.so`) and the trend test's kernels
(`agent/detect/_kernels*.so`, a CPython extension) with the system C compiler.

Everything else about the package lives in pyproject.toml. The shim is a plain shared library (no
Python symbols, links only libdl and libpthread) built as an extension so that every install path
compiles it: `pip install .` puts it inside the installed package; `pip install -e .` and
`python setup.py build_ext --inplace` put it next to native_hooks/shim.c. setuptools names it with
the interpreter's suffix (`libmedic_shim.cpython-311-x86_64-linux-gnu.so`); `native_hooks.shim_path()`
finds it under either name.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "native_hooks.libmedic_shim",
            sources=["native_hooks/shim.c"],
            libraries=["dl", "pthread"],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-Wall", "-Wextra", "-std=gnu11"],
        ),
        # the trend test's O(n^2) kernels; agent.detect.trend falls back to Python without them
        Extension(
            "agent.detect._kernels",
            sources=["agent/detect/_kernels.c"],
            extra_compile_args=["-O2", "-Wall", "-Wextra", "-std=gnu11", "-ffp-contract=off"],
        ),
    ],
)
