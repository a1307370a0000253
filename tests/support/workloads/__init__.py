"""Allocation workloads for the tests and the hook overhead benchmark: a C program and a Python script
driven by the same stdin commands (see alloc_target.c), plus helpers to build and start them under a
chosen allocator with the hook switched on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from native_hooks.errors import ShimNotBuilt
from native_hooks.preloads import PRELOADS
from native_hooks.shim import shim_path

HERE = Path(__file__).resolve().parent
C_SOURCE = HERE / "alloc_target.c"
PY_SCRIPT = HERE / "alloc_target.py"
REPO = HERE.parents[2]


def build_c_target(out_dir: str | os.PathLike[str]) -> str:
    """Compile alloc_target.c with the system C compiler; returns the binary's path."""
    binary = Path(out_dir) / "alloc_target"
    subprocess.run(
        ["cc", "-O2", "-g", "-pthread", "-o", str(binary), str(C_SOURCE)],
        check=True,
        capture_output=True,
        text=True,
    )
    return str(binary)


STATIC_JEMALLOC_MAIN = """
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
void *volatile sink;
int main(void) {
    for (int i = 0; i < 100; i++) { sink = malloc(1000); free(sink); }
    printf("ready %d\\n", getpid()); fflush(stdout); pause(); return 0;
}
"""
JEMALLOC_ARCHIVE = "/usr/lib/x86_64-linux-gnu/libjemalloc_pic.a"  # Debian package libjemalloc-dev


def build_static_jemalloc(
    out_dir: str | os.PathLike[str], name: str, rdynamic: bool = False, strip: bool = False
) -> str:
    """A program with jemalloc linked in statically (prints `ready PID`, then waits); `rdynamic`
    exports `mallctl`, `strip` removes the symbol table."""
    source = Path(out_dir) / "static_jemalloc.c"
    source.write_text(STATIC_JEMALLOC_MAIN)
    binary = Path(out_dir) / name
    flags = ["-rdynamic"] if rdynamic else []
    libs = ["-lpthread", "-ldl", "-lm", "-lstdc++"]
    subprocess.run(["cc", "-O1", *flags, "-o", str(binary), str(source), JEMALLOC_ARCHIVE, *libs], check=True)
    if strip:
        subprocess.run(["strip", str(binary)], check=True)
    return str(binary)


def build_library_needing_jemalloc(out_dir: str | os.PathLike[str]) -> str:
    """`libfoo.so`, which depends on libjemalloc: preloading it maps jemalloc, yet malloc stays glibc's."""
    source = Path(out_dir) / "foo.c"
    source.write_text("int foo(void) { return 42; }\n")
    library = Path(out_dir) / "libfoo.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-o", str(library), str(source), "-Wl,--no-as-needed", "-ljemalloc"],
        check=True,
    )
    return str(library)


def ensure_shim() -> str:
    """The shim's path, compiling it in place first when running from a checkout without a build
    (or with a build older than shim.c)."""
    source = REPO / "native_hooks" / "shim.c"
    try:
        path = shim_path()
        if os.path.getmtime(path) >= os.path.getmtime(source):
            return path
    except ShimNotBuilt:
        if not (REPO / "setup.py").is_file():
            raise
    subprocess.run(
        [
            sys.executable,
            "setup.py",
            "-q",
            "build_ext",
            "--inplace",
            "--build-temp",
            f"/tmp/medic-build-{os.getuid()}/temp",
            "--build-lib",
            f"/tmp/medic-build-{os.getuid()}/lib",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    return shim_path()


def target_env(
    allocator: str,
    socket: str | None = None,
    shim: bool = False,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """Environment for a target under `allocator`, with the hook socket template `socket` and, for
    native targets, the shim preloaded. Never inherits the caller's hook variables."""
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("MEDIC_HOOK", "MALLOC_CONF", "HEAPPROFILE"))
    }
    env.pop("LD_PRELOAD", None)
    preload = [lib for lib in (PRELOADS[allocator], ensure_shim() if shim else None) if lib]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    if socket:
        env["MEDIC_HOOK_SOCKET"] = socket
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra or {})
    return env


def python_argv() -> list[str]:
    """The real interpreter (not a pyenv shim, so LD_PRELOAD reaches only the target) and the script."""
    return [sys.executable, str(PY_SCRIPT)]


class TargetIO:
    """Line commands to a started target (stdin/stdout pipes in text mode)."""

    def __init__(self, proc: subprocess.Popen[str], timeout: float = 30.0) -> None:
        self.proc = proc
        self.timeout = timeout
        ready = self._line()
        if not ready.startswith("ready "):
            raise RuntimeError(f"target did not start: {ready!r} (exit {proc.poll()})")
        self.pid = int(ready.split()[1])

    def _line(self) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + self.timeout
        line = self.proc.stdout.readline()
        if not line or time.monotonic() > deadline:
            raise RuntimeError(f"target {self.proc.pid} stopped answering (exit {self.proc.poll()})")
        return line.strip()

    def exit(self) -> int:
        """Ask the target to exit normally (destructors and atexit run); returns its exit status."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("exit\n")
        self.proc.stdin.flush()
        return self.proc.wait(timeout=self.timeout)

    def command(self, text: str) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        reply = self._line()
        if not reply.startswith("ok"):
            raise RuntimeError(f"target refused {text!r}: {reply}")
        return reply[2:].strip()
