"""The floor under the probes' cost: reading the same files with nothing around the reads.

`benchmarks.probe_cost` prints the agent's fast tick beside this floor. Per instance, the floor reads
what the fast probes read (`/proc/PID/stat`, `statm`, `status`, the entries of `fd`, and the files of
its cgroup that the `cgroup` probe reads on this host: memory, cpu and pressure) in a tight loop:

- in Python, each file with one `os.open`/`os.read`/`os.close`, the fd directory with `os.listdir`;
- in C, the same with `open`/`read`/`close` and `opendir`/`readdir`, compiled at run time with `cc`
  (left out when there is no compiler).

Both are timed in CPU time of the reading thread (`time.thread_time`, `CLOCK_THREAD_CPUTIME_ID`), so
the kernel's work behind each read counts, as it does for the probes.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from probes.linux.cgroupfs import ControllerDir, ancestors, locate_cgroups
from probes.linux.procfs import HOST_ROOT, proc_path


@dataclass(frozen=True, slots=True)
class FloorFiles:
    """What the floor reads for one instance: files read whole, and directories whose entries it counts."""

    proc: tuple[str, ...]
    cgroup: tuple[str, ...]
    directories: tuple[str, ...]


def _memory_files(directory: ControllerDir) -> list[str]:
    if directory.version == 1:
        names = ("memory.usage_in_bytes", "memory.stat", "memory.oom_control", "memory.failcnt")
        return [f"{directory.path}/{name}" for name in names]
    own = [f"{directory.path}/{name}" for name in ("memory.current", "memory.stat", "memory.events")]
    return own + [f"{path}/memory.max" for path in ancestors(directory)]


def floor_files(pid: int, root: Path = HOST_ROOT) -> FloorFiles:
    """The files of `pid` that the fast probes read, those this host has."""
    proc = tuple(proc_path(root, pid, name) for name in ("stat", "statm", "status"))
    location = locate_cgroups(pid, root)
    cgroup: list[str] = []
    if location.memory:
        cgroup += _memory_files(location.memory)
    if location.cpu:
        cgroup.append(f"{location.cpu.path}/cpu.stat")
    if location.unified:
        cgroup += [f"{location.unified.path}/{name}.pressure" for name in ("memory", "cpu")]
    existing = tuple(path for path in cgroup if os.path.exists(path))
    return FloorFiles(proc, existing, (proc_path(root, pid, "fd"),))


def _read_whole(path: str) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = 0
        while chunk := os.read(fd, 65536):
            size += len(chunk)
        return size
    finally:
        os.close(fd)


def python_pass(instances: list[FloorFiles], cgroup: bool = True) -> float:
    """One pass over every instance's files; CPU µs per instance (the cgroup's files left out if not `cgroup`)."""
    started = time.thread_time()
    for files in instances:
        for path in files.proc:
            _read_whole(path)
        if cgroup:
            for path in files.cgroup:
                _read_whole(path)
        for path in files.directories:
            len(os.listdir(path))
    return (time.thread_time() - started) * 1e6 / max(1, len(instances))


C_SOURCE = r"""
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* stdin: "f PATH" (read it whole), "d PATH" (count its entries), "-" (end of one instance).
   argv[1]: rounds. Prints, per round, the CPU microseconds per instance of one pass. */
static char buffer[65536];
static char *paths[4096];
static char kinds[4096];

static double cpu_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 10, count = 0, instances = 0;
    char line[4200];
    while (count < 4096 && fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        if (line[0] == '-') { instances++; continue; }
        if (strlen(line) < 3) continue;
        kinds[count] = line[0];
        paths[count++] = strdup(line + 2);
    }
    long sink = 0;
    for (int round = 0; round < rounds; round++) {
        double start = cpu_us();
        for (int i = 0; i < count; i++) {
            if (kinds[i] == 'f') {
                int fd = open(paths[i], O_RDONLY | O_CLOEXEC);
                if (fd < 0) continue;
                ssize_t got;
                while ((got = read(fd, buffer, sizeof buffer)) > 0) sink += got;
                close(fd);
            } else {
                DIR *dir = opendir(paths[i]);
                if (!dir) continue;
                while (readdir(dir)) sink++;
                closedir(dir);
            }
        }
        printf("%.3f\n", (cpu_us() - start) / (instances ? instances : 1));
    }
    return sink < 0;
}
"""


def c_floor(instances: list[FloorFiles], rounds: int) -> list[float] | None:
    """CPU µs per instance of each of `rounds` passes in C; None without a C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    with tempfile.TemporaryDirectory(prefix="medic-floor-") as work:
        source, program = Path(work) / "floor.c", Path(work) / "floor"
        source.write_text(C_SOURCE)
        built = subprocess.run([compiler, "-O2", "-o", str(program), str(source)], capture_output=True)
        if built.returncode != 0:
            return None
        lines = []
        for files in instances:
            lines += [f"f {path}" for path in (*files.proc, *files.cgroup)]
            lines += [f"d {path}" for path in files.directories]
            lines.append("-")
        ran = subprocess.run(
            [str(program), str(rounds)], input="\n".join(lines) + "\n", capture_output=True, text=True
        )
        if ran.returncode != 0:
            return None
        return [float(value) for value in ran.stdout.split()]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
