"""medic never runs a program nor reads a file that a less privileged target controls.

A target's user can plant a `bin/jcmd` beside its own `java`, a `c++filt` early on PATH, a symlink or a
FIFO where medic reads heap-profile dumps or ELF objects, or a socket where medic looks for the hook.
Real processes throughout: fake and real JVMs started as `nobody`, real listeners on Unix sockets.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.core.errors import ProbeUnavailable
from agent.core.records import ProbeTarget
from native_hooks.client import HookClient
from native_hooks.errors import HookNotFound
from native_hooks.heapprofile import MAPS_MARKER, HeapProfileRefused, Mapping, read_heap_profile
from native_hooks.sockets import candidate_paths, find_socket
from native_hooks.symbolize import Symbolizer
from probes.heapprof import HeapProfileProbe, newest_dump
from probes.jcmd import find_jcmd
from probes.jvm import JvmProbe
from support.histo import build_java, clean_env, read_ready
from support.procs import wait_until

NOBODY = 65534
AS_NOBODY = {"user": NOBODY, "group": NOBODY, "extra_groups": []}
IS_ROOT = os.geteuid() == 0
DUMP = (
    "heap profile:      1:      100 [     1:      100] @ heapprofile\n"
    "     1:      100 [     1:      100] @ 0x401000\n\n"
    f"{MAPS_MARKER}\n00400000-00402000 r-xp 00000000 00:00 0 /bin/true\n"
)
# maps the file it is given, as a JVM maps its libjvm.so, then waits
MAPPER_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0 || mmap(0, 4096, PROT_READ, MAP_PRIVATE, fd, 0) == MAP_FAILED) return 1;
    printf("ready %d\n", getpid());
    fflush(stdout);
    pause();
    return 0;
}
"""


def _open_dir(prefix: str, owner: int = 0) -> Path:
    """A fresh directory under /tmp that `nobody` can traverse (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    os.chown(path, owner, owner)
    return path


@pytest.fixture
def scratch() -> Iterator[list[Path]]:
    made: list[Path] = []
    yield made
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def _script(path: Path, body: str, mode: int = 0o755) -> Path:
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(mode)
    return path


def _wait_exec(pid: int, variable: str) -> None:
    """Until the child has exec'd (before, /proc/PID/environ is still the parent's)."""
    wait_until(lambda: f"{variable}=".encode() in Path(f"/proc/{pid}/environ").read_bytes())


def _jvm_target(pid: int, **jvm) -> ProbeTarget:
    settings = {"histograms": {"jvm": {"interval": 1.0, "heap_interval": 1.0, **jvm}}}
    return ProbeTarget("jvm-nobody", pid, 1000.0, {}, settings)


# ------------------------------------------------------------------------------------------- jcmd
@pytest.fixture
def fake_jdk(scratch, tmp_path) -> Path:
    """A JDK directory owned by `nobody`: `bin/java` maps `lib/libjvm.so`, `bin/jcmd` writes a marker."""
    jdk = _open_dir("medic-fake-jdk-")
    scratch.append(jdk)
    (jdk / "bin").mkdir()
    (jdk / "lib").mkdir()
    source = tmp_path / "mapper.c"
    source.write_text(MAPPER_C)
    subprocess.run(
        ["cc", "-o", str(jdk / "bin/java"), str(source)], check=True, capture_output=True, timeout=60
    )
    (jdk / "lib/libjvm.so").write_bytes(b"\0" * 4096)
    _script(jdk / "bin/jcmd", f"touch {jdk}/marker")
    for path in [jdk, *jdk.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
        path.chmod(0o644 if path.suffix == ".so" else 0o755)
    return jdk


@pytest.mark.root
@pytest.mark.skipif(not IS_ROOT, reason="needs root")
def test_the_jcmd_of_a_jdk_another_user_owns_is_never_run(spawn, fake_jdk):
    """Acceptance: a process of `nobody` that looks like a JVM from its own JDK; a root medic does not
    run that JDK's jcmd and says why."""
    proc = spawn(
        [str(fake_jdk / "bin/java"), str(fake_jdk / "lib/libjvm.so")],
        stdout=subprocess.PIPE,
        text=True,
        **AS_NOBODY,
    )
    pid = int(read_ready(proc)[1])
    with pytest.raises(ProbeUnavailable, match="another user can change") as refused:
        JvmProbe().collect(_jvm_target(pid), time.time())
    assert "belongs to uid 65534" in str(refused.value) and "histograms.jvm.jcmd" in str(refused.value)
    configured = _jvm_target(pid, jcmd=str(fake_jdk / "bin/jcmd"))
    with pytest.raises(ProbeUnavailable, match=r"histograms\.jvm\.jcmd .* is not safe to run"):
        JvmProbe().collect(configured, time.time())
    assert not (fake_jdk / "marker").exists()
    assert proc.poll() is None  # and no jcmd sent it the attach SIGQUIT


def test_a_configured_jcmd_others_can_write_is_refused(tmp_path):
    marker = tmp_path / "marker"
    jcmd = _script(tmp_path / "jcmd", f"touch {marker}", mode=0o777)
    with pytest.raises(ProbeUnavailable, match="writable by group or others"):
        find_jcmd(os.getpid(), str(jcmd))
    with pytest.raises(ProbeUnavailable, match="not an executable file"):
        find_jcmd(os.getpid(), str(tmp_path / "missing"))
    assert not marker.exists()


needs_jdk = pytest.mark.skipif(
    shutil.which("javac") is None or shutil.which("jcmd") is None, reason="needs a JDK"
)


@pytest.mark.root
@pytest.mark.slow
@needs_jdk
@pytest.mark.skipif(not IS_ROOT, reason="needs root")
def test_jcmd_runs_as_the_jvms_user_and_still_reads_the_histogram(spawn, scratch, monkeypatch):
    """A real JVM of `nobody`: the system jcmd attaches as `nobody` (root's supplementary groups and
    uid are dropped), and a configured, trusted jcmd does too."""
    # the probe's command directories go to a temporary root of this test's own, so that the check
    # that they are gone is not fooled by other tests' JVM probes running at the same time
    private_tmp = _open_dir("medic-tmproot-")
    scratch.append(private_tmp)
    monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
    classes = _open_dir("medic-java-")
    scratch.append(classes)
    build_java(classes)
    for path in classes.iterdir():
        path.chmod(0o644)
    seen = _open_dir("medic-seen-", owner=NOBODY)
    tools = _open_dir("medic-tools-")
    scratch += [seen, tools]
    wrapper = _script(tools / "jcmd", f'id -u > {seen}/uid; id -G > {seen}/groups; exec jcmd "$@"')
    argv = ["java", "-Xmx64m", "-XX:+UseSerialGC", "-cp", str(classes), "LeakClasses", "50"]
    proc = spawn(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(),
        cwd=classes,
        **AS_NOBODY,
    )
    pid = int(read_ready(proc)[1])
    result = JvmProbe().collect(_jvm_target(pid), time.time())
    assert result.problems == [] and "jvm_histogram_bytes" in {s.metric for s in result.samples}
    result = JvmProbe().collect(_jvm_target(pid, jcmd=str(wrapper)), time.time())
    assert result.problems == [] and "jvm_histogram_bytes" in {s.metric for s in result.samples}
    assert (seen / "uid").read_text().split() == [str(NOBODY)]
    assert (seen / "groups").read_text().split() == [str(NOBODY)]
    assert list(private_tmp.iterdir()) == []  # its command directories are gone


# ------------------------------------------------------------------------------ heap-profile dumps
def test_a_dump_that_is_a_symlink_or_a_fifo_is_refused(tmp_path):
    real = tmp_path / "real.heap"
    real.write_text(DUMP)
    link = tmp_path / "link.heap"
    link.symlink_to(real)
    fifo = tmp_path / "fifo.heap"
    os.mkfifo(fifo)
    mine = {os.geteuid()}
    assert read_heap_profile(real, owners=mine).live_bytes == 100
    with pytest.raises(HeapProfileRefused, match="symlink"):
        read_heap_profile(link, owners=mine)
    with pytest.raises(HeapProfileRefused, match="not a regular file"):
        read_heap_profile(fifo, owners=mine)  # and it does not hang waiting for a writer


def _dump_dir_target(spawn, directory: Path) -> ProbeTarget:
    proc = spawn(["sleep", "30"], env=clean_env(HEAPPROFILE=f"{directory}/hp"))
    _wait_exec(proc.pid, "HEAPPROFILE")
    return ProbeTarget("c1", proc.pid, 1.0, {}, {"histograms": {"heap_profiles": {"dir": str(directory)}}})


def test_a_symlinked_dump_in_the_directory_is_not_picked(spawn, tmp_path):
    outside = tmp_path / "secret.heap"
    outside.write_text(DUMP)
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    (dumps / "hp.0001.heap").symlink_to(outside)
    old = time.time() - 5
    os.utime(dumps / "hp.0001.heap", (old, old), follow_symlinks=False)
    os.utime(outside, (old, old))
    target = _dump_dir_target(spawn, dumps)
    assert newest_dump(dumps, target, None) is None
    assert HeapProfileProbe().collect(target, time.time()).samples == []


@pytest.mark.root
@pytest.mark.skipif(not IS_ROOT, reason="needs root")
def test_a_dump_owned_by_another_user_is_refused(spawn, tmp_path):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    dump = dumps / "hp.0001.heap"
    dump.write_text(DUMP)
    os.chown(dump, NOBODY, NOBODY)  # neither the target's (root) nor medic's
    old = time.time() - 5
    os.utime(dump, (old, old))
    with pytest.raises(HeapProfileRefused, match="belongs to uid 65534"):
        HeapProfileProbe().collect(_dump_dir_target(spawn, dumps), time.time())
    assert read_heap_profile(dump, owners={NOBODY}).live_bytes == 100  # the target's own dump is read


# -------------------------------------------------------------------------------- symbolization
def test_cxxfilt_is_taken_only_from_a_trusted_path(tmp_path, monkeypatch):
    planted = tmp_path / "bin"
    planted.mkdir()
    marker = tmp_path / "marker"
    _script(planted / "c++filt", f"touch {marker}; cat", mode=0o777)
    monkeypatch.setenv("PATH", f"{planted}:/usr/bin:/bin")
    symbolizer = Symbolizer()
    assert symbolizer.demangler is None and "writable by group or others" in (
        symbolizer.demangle_problem or ""
    )
    assert symbolizer._demangle({"_ZN6ranker5twiceEi"}) == {"_ZN6ranker5twiceEi": "_ZN6ranker5twiceEi"}
    assert not marker.exists()
    if shutil.which("c++filt", path="/usr/bin:/bin"):
        monkeypatch.setenv("PATH", "/usr/bin:/bin")
        trusted = Symbolizer()
        assert trusted.demangler is not None and trusted.demangler.startswith("/usr/")
        assert trusted.demangle_problem is None


@pytest.mark.root
@pytest.mark.skipif(not IS_ROOT or shutil.which("c++filt") is None, reason="needs root and c++filt")
def test_cxxfilt_runs_as_the_targets_user(scratch, monkeypatch):
    tools = _open_dir("medic-tools-")
    seen = _open_dir("medic-seen-", owner=NOBODY)
    scratch += [tools, seen]
    real = shutil.which("c++filt")
    _script(tools / "c++filt", f"id -u > {seen}/uid; exec {real}")
    monkeypatch.setenv("PATH", f"{tools}:/usr/bin:/bin")
    symbolizer = Symbolizer()
    symbolizer.run_as = AS_NOBODY
    assert symbolizer._demangle({"_ZN6ranker5twiceEi"}) == {"_ZN6ranker5twiceEi": "ranker::twice(int)"}
    assert (seen / "uid").read_text().split() == [str(NOBODY)]


def test_a_mapped_object_that_is_a_fifo_or_a_symlink_is_not_opened(tmp_path):
    """A target can replace a mapped file by a FIFO: a blocking open would hang the probe forever."""
    fifo = tmp_path / "libfifo.so"
    os.mkfifo(fifo)
    link = tmp_path / "liblink.so"
    link.symlink_to(sys.executable)
    maps = [Mapping(0x1000, 0x3000, "r-xp", 0, str(fifo)), Mapping(0x10000, 0x20000, "r-xp", 0, str(link))]
    frames: dict = {}
    worker = threading.Thread(
        target=lambda: frames.update(Symbolizer(demangle=False).symbolize([0x1800, 0x10100], maps)),
        daemon=True,
    )
    worker.start()
    worker.join(10)
    if worker.is_alive():  # release the blocked open before failing
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert not worker.is_alive()
    assert frames[0x1800].function == "libfifo.so+0x800" and not frames[0x1800].known
    assert not frames[0x10100].known  # the link's target is not read


# ------------------------------------------------------------------------------------ hook sockets
SERVER = r"""
import json, os, socket, sys
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen(4)
print("ready", os.getpid(), flush=True)
while True:
    conn, _ = listener.accept()
    if conn.recv(4096):
        conn.sendall(json.dumps({"ok": True, "op": "ping", "pid": int(sys.argv[2])}).encode() + b"\n")
    conn.close()
"""


def test_a_hook_served_by_another_process_is_not_believed(spawn, sock_dir):
    """An impostor listening where the target's hook should be (and claiming the target's pid in its
    replies): SO_PEERCRED names the real server, and the client refuses it."""
    target = spawn(["sleep", "30"])
    path = f"{sock_dir}/hook.{target.pid}.sock"
    impostor = spawn([sys.executable, "-c", SERVER, path, str(target.pid)], stdout=subprocess.PIPE, text=True)
    read_ready(impostor)
    with (
        pytest.raises(HookNotFound, match=f"belongs to pid {impostor.pid}"),
        HookClient(path, pid=target.pid) as client,
    ):
        client.request("ping")
    with HookClient(path, pid=impostor.pid) as client:  # the server itself is trusted
        assert client.request("ping")["ok"]


def test_find_socket_skips_a_planted_symlink(spawn, sock_dir):
    elsewhere = tempfile.mkdtemp(prefix="mk-", dir="/tmp")
    try:
        target = spawn(["sleep", "30"], env={**os.environ, "MEDIC_HOOK_DIR": sock_dir})
        _wait_exec(target.pid, "MEDIC_HOOK_DIR")
        real = f"{elsewhere}/s.sock"
        server = spawn(
            [sys.executable, "-c", SERVER, real, str(target.pid)], stdout=subprocess.PIPE, text=True
        )
        read_ready(server)
        os.symlink(real, f"{sock_dir}/hook.{target.pid}.sock")
        assert f"{sock_dir}/hook.{target.pid}.sock" in candidate_paths(target.pid)
        assert find_socket(target.pid) is None
    finally:
        shutil.rmtree(elsewhere, ignore_errors=True)


@pytest.mark.root
@pytest.mark.skipif(not IS_ROOT or not os.path.exists("/usr/bin/python3"), reason="needs root")
def test_find_socket_skips_a_socket_another_user_bound(spawn, sock_dir):
    os.chmod(sock_dir, 0o1777)  # a shared directory, such as a MEDIC_HOOK_DIR of /tmp
    target = spawn(["sleep", "30"], env={**os.environ, "MEDIC_HOOK_DIR": sock_dir})
    _wait_exec(target.pid, "MEDIC_HOOK_DIR")
    path = f"{sock_dir}/hook.{target.pid}.sock"
    planted = spawn(  # the system python: nobody cannot reach the virtualenv's under /root
        ["/usr/bin/python3", "-c", SERVER, path, str(target.pid)],
        stdout=subprocess.PIPE,
        text=True,
        **AS_NOBODY,
    )
    read_ready(planted)
    wait_until(lambda: os.path.exists(path))
    assert stat.S_ISSOCK(os.lstat(path).st_mode) and os.lstat(path).st_uid == NOBODY
    assert path in candidate_paths(target.pid)
    assert find_socket(target.pid) is None
