"""The allocator probe against real targets: samples named after the catalog, socket from the target's
labels or by convention, clear errors without a hook, for a vanished process, or a foreign socket."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from agent.core.catalog import CATALOG
from agent.core.errors import ProbeUnavailable, TargetGone
from agent.core.records import ProbeTarget
from native_hooks.errors import HookNotFound
from probes.allocator import AllocatorProbe, hook_socket_for
from probes.registry import PROBES, create_probe
from support.native import start_target
from support.procs import wait_until
from support.workloads import build_c_target, python_argv, target_env

pytestmark = [pytest.mark.native, pytest.mark.slow]
MiB = 1024 * 1024


@pytest.fixture(scope="module")
def c_binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_c_target(tmp_path_factory.mktemp("bin"))


def _target(pid: int, hook_socket: str | None = None) -> ProbeTarget:
    settings = {"hook": {"socket": hook_socket}} if hook_socket else {}
    return ProbeTarget(instance="serving-0", pid=pid, start_time=0.0, settings=settings)


def test_registered_and_on_by_default() -> None:
    assert PROBES["allocator"].default_enabled
    probe = create_probe("allocator")
    assert probe.name == "allocator" and probe.schedule == "fast"


@pytest.mark.parametrize("allocator", ["jemalloc", "tcmalloc", "glibc"])
def test_samples_from_a_shim_target_found_by_convention(
    spawn, c_binary: str, sock_dir: str, allocator: str
) -> None:
    env = target_env(allocator, "auto", shim=True, extra={"MEDIC_HOOK_DIR": sock_dir})
    target = start_target(spawn, [c_binary], env)
    target.command(f"alloc 32 {MiB}")
    wait_until(lambda: os.path.exists(f"{sock_dir}/hook.{target.pid}.sock"))
    result = AllocatorProbe().collect(_target(target.pid), now=100.0)
    values = {s.metric: s.value for s in result.samples}
    assert not result.problems
    assert all(CATALOG[m].source == "allocator" for m in values)
    assert values["allocator_allocated_bytes"] >= 32 * MiB
    assert values["allocator_resident_bytes"] >= values["allocator_allocated_bytes"] * 0.9
    assert values["allocator_fragmentation_ratio"] > 0
    expected = 9 if allocator != "glibc" else 5  # 8 figures + the ratio; glibc lacks 4 of them
    assert len(values) == expected, sorted(values)
    assert all(s.ts == 100.0 and s.instance == "serving-0" for s in result.samples)


def test_python_target_through_a_configured_socket_label(spawn, sock_dir: str) -> None:
    template = f"{sock_dir}/api.%p.sock"
    target = start_target(spawn, python_argv(), target_env("jemalloc", template))
    probe_target = _target(target.pid, hook_socket=template)
    assert hook_socket_for(probe_target) == f"{sock_dir}/api.{target.pid}.sock"
    values = {s.metric: s.value for s in AllocatorProbe().collect(probe_target, now=1.0).samples}
    assert values["pymalloc_allocated_blocks"] > 1000
    assert values["allocator_allocated_bytes"] > 0


def test_no_hook_is_unavailable_and_says_how_to_get_one(spawn, c_binary: str) -> None:
    target = start_target(spawn, [c_binary], target_env("glibc"))
    with pytest.raises(
        HookNotFound, match=r"LD_PRELOAD=\$\(medic hook path\) MEDIC_HOOK_SOCKET=auto"
    ) as caught:
        AllocatorProbe().collect(_target(target.pid), now=1.0)
    assert isinstance(caught.value, ProbeUnavailable)


def test_a_stale_socket_is_unavailable(sock_dir: str, spawn, c_binary: str) -> None:
    import socket

    target = start_target(spawn, [c_binary], target_env("glibc"))
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(f"{sock_dir}/dead.sock")
    stale.close()
    with pytest.raises(ProbeUnavailable, match="nothing listens"):
        AllocatorProbe().collect(_target(target.pid, hook_socket=f"{sock_dir}/dead.sock"), now=1.0)


def test_a_vanished_process_is_target_gone() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(TargetGone):
        AllocatorProbe().collect(_target(proc.pid), now=1.0)


def test_a_socket_of_another_process_is_refused(spawn, c_binary: str, sock_dir: str) -> None:
    other = start_target(spawn, [c_binary], target_env("glibc", f"{sock_dir}/h.%p.sock", shim=True))
    mine = start_target(spawn, [c_binary], target_env("glibc"))
    foreign = f"{sock_dir}/h.{other.pid}.sock"
    with pytest.raises(ProbeUnavailable, match=f"belongs to pid {other.pid}"):
        AllocatorProbe().collect(_target(mine.pid, hook_socket=foreign), now=1.0)


def test_the_socket_of_a_killed_target_is_removed_once_its_zombie_is_reaped(
    spawn, c_binary: str, sock_dir: str
) -> None:
    """A process KILLed leaves its socket behind; while it is an unreaped zombie `kill(pid, 0)` still
    succeeds and the young socket cannot be told from one between bind() and listen(), so `forget`
    leaves it; the next collection, of any target, removes it once the pid is really gone."""
    template = f"{sock_dir}/h.%p.sock"
    doomed = start_target(spawn, [c_binary], target_env("glibc", template, shim=True))
    other = start_target(spawn, [c_binary], target_env("glibc", template, shim=True))
    probe = AllocatorProbe()
    gone, alive = _target(doomed.pid, hook_socket=template), _target(other.pid, hook_socket=template)
    assert probe.collect(gone, now=1.0).samples
    path = f"{sock_dir}/h.{doomed.pid}.sock"

    os.kill(doomed.pid, signal.SIGKILL)
    wait_until(lambda: Path(f"/proc/{doomed.pid}/stat").read_text().split(")")[-1].split()[0] == "Z")
    probe.forget(gone)
    assert os.path.exists(path)  # a zombie: maybe a live process between bind() and listen()
    assert probe.collect(alive, now=2.0).samples and os.path.exists(path)

    doomed.proc.wait()
    assert probe.collect(alive, now=3.0).samples
    assert not os.path.exists(path)
    assert os.path.exists(f"{sock_dir}/h.{other.pid}.sock")  # the living target's socket is kept


def test_a_target_that_dies_and_is_forgotten_while_its_answer_is_read_leaves_no_socket(
    spawn, c_binary: str, sock_dir: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tracker (another thread) may reap and forget a process between its answer and the probe
    recording the socket it answered on: the probe sees the process gone and removes the socket itself."""
    import probes.allocator as allocator

    template = f"{sock_dir}/h.%p.sock"
    doomed = start_target(spawn, [c_binary], target_env("glibc", template, shim=True))
    probe = AllocatorProbe()
    target = _target(doomed.pid, hook_socket=template)
    real_pids = allocator.namespace_pids

    def dies_meanwhile(pid: int, root: Path) -> set[int]:
        pids = real_pids(pid, root)
        doomed.proc.kill()
        doomed.proc.wait()
        probe.forget(target)  # the tracker's thread, before the answer is recorded
        return pids

    monkeypatch.setattr(allocator, "namespace_pids", dies_meanwhile)
    assert probe.collect(target, now=1.0).samples  # the answer came while it lived
    assert not os.path.exists(f"{sock_dir}/h.{doomed.pid}.sock")
