"""Allocator detection from outside (/proc, ELF) and `medic doctor`'s diagnosis on real processes:
preloaded jemalloc/tcmalloc, plain glibc, static jemalloc (stripped or not), a mapped-but-unused
jemalloc, and targets with and without a hook."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from agent.core.errors import TargetGone
from native_hooks.doctor import diagnose, render
from native_hooks.which_allocator import detect_allocator
from support.native import build_native_bins, start_target
from support.procs import REPO, wait_until
from support.workloads import ensure_shim, python_argv, target_env

pytestmark = [pytest.mark.native, pytest.mark.slow]


@pytest.fixture(scope="module")
def bins(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return build_native_bins(tmp_path_factory.mktemp("doctor-bins"))


@pytest.mark.parametrize(
    ("allocator", "expected", "profiler"),
    [
        ("glibc", "glibc", False),
        ("jemalloc", "jemalloc", True),
        ("tcmalloc", "tcmalloc", True),
        ("tcmalloc_minimal", "tcmalloc", False),
    ],
)
def test_detect_preloaded_and_plain(spawn, bins, allocator: str, expected: str, profiler: bool) -> None:
    target = start_target(spawn, [bins["target"]], target_env(allocator))
    guess = detect_allocator(target.pid)
    assert guess.allocator == expected and not guess.static and guess.heap_profiler is profiler
    if allocator != "glibc":
        assert "loaded by LD_PRELOAD" in guess.evidence and guess.env["LD_PRELOAD"]


@pytest.mark.parametrize(("name", "exported"), [("static", False), ("stripped", False), ("rdynamic", True)])
def test_detect_static_jemalloc(spawn, bins, name: str, exported: bool) -> None:
    target = start_target(spawn, [bins[name]], target_env("glibc"))
    guess = detect_allocator(target.pid)
    assert guess.allocator == "jemalloc" and guess.static and guess.stats_exported is exported
    if name == "stripped":
        assert any("<jemalloc>:" in item for item in guess.evidence)


def test_detect_mapped_but_unused_jemalloc(spawn, bins) -> None:
    env = target_env("glibc", extra={"LD_PRELOAD": bins["libfoo"]})
    guess = detect_allocator(start_target(spawn, [bins["target"]], env).pid)
    assert guess.allocator == "glibc"
    assert "jemalloc is mapped but does not serve malloc" in guess.evidence


def test_detect_a_python_process(spawn) -> None:
    guess = detect_allocator(start_target(spawn, python_argv(), target_env("glibc")).pid)
    assert guess.is_python and guess.allocator == "glibc"


def test_detect_a_vanished_process() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    with pytest.raises(TargetGone):
        detect_allocator(proc.pid)


# -- diagnose --------------------------------------------------------------------------------------
def test_native_glibc_without_hook_gets_the_shim_line_and_jemalloc_advice(spawn, bins) -> None:
    target = start_target(spawn, [bins["target"]], target_env("glibc"))
    report = diagnose(target.pid)
    assert report.allocator == "glibc" and not report.hook.reachable
    advice = " ".join(report.advice)
    assert f"LD_PRELOAD={ensure_shim()} MEDIC_HOOK_SOCKET=auto" in advice
    assert "LD_PRELOAD=libjemalloc.so.2" in advice
    assert "none reachable" in render(report)


def test_jemalloc_with_shim_is_reached_and_asked_for_profiling(spawn, bins, sock_dir: str) -> None:
    env = target_env("jemalloc", "auto", shim=True, extra={"MEDIC_HOOK_DIR": sock_dir})
    target = start_target(spawn, [bins["target"]], env)
    wait_until(lambda: os.path.exists(f"{sock_dir}/hook.{target.pid}.sock"))
    report = diagnose(target.pid, socket=f"{sock_dir}/hook.{target.pid}.sock")
    assert report.hook.reachable and report.hook.kind == "shim" and report.allocator == "jemalloc"
    assert report.hook.figures["allocated"] > 0
    assert any("MALLOC_CONF=prof:true,prof_active:false" in item for item in report.advice)
    assert not any("restart it with LD_PRELOAD" in item for item in report.advice)


def test_jemalloc_with_profiling_and_hook_has_nothing_to_add(spawn, bins, sock_dir: str) -> None:
    env = target_env("jemalloc", f"{sock_dir}/h.%p.sock", shim=True, extra={"MALLOC_CONF": "prof:true"})
    target = start_target(spawn, [bins["target"]], env)
    report = diagnose(target.pid, socket=f"{sock_dir}/h.{target.pid}.sock")
    assert report.advice == []
    assert "nothing to add" in render(report)


def test_tcmalloc_minimal_is_told_about_the_full_library(spawn, bins) -> None:
    report = diagnose(start_target(spawn, [bins["target"]], target_env("tcmalloc_minimal")).pid)
    assert any("libtcmalloc.so.4" in item for item in report.advice)


def test_python_target_with_hook_is_told_about_pymalloc(spawn, sock_dir: str) -> None:
    env = target_env("jemalloc", f"{sock_dir}/h.%p.sock")
    target = start_target(spawn, python_argv(), env)
    report = diagnose(target.pid, socket=f"{sock_dir}/h.{target.pid}.sock")
    assert report.hook.kind == "python" and report.hook.python["pymalloc"] is True
    assert any("PYTHONMALLOC=malloc" in item for item in report.advice)


def test_a_socket_served_by_another_process_is_not_believed(spawn, sock_dir: str) -> None:
    """The hook at the given path answers, but for another process: its figures are not the target's."""
    env = target_env("jemalloc", f"{sock_dir}/h.%p.sock")
    target, other = start_target(spawn, python_argv(), env), start_target(spawn, python_argv(), env)
    wait_until(lambda: os.path.exists(f"{sock_dir}/h.{other.pid}.sock"))
    report = diagnose(target.pid, socket=f"{sock_dir}/h.{other.pid}.sock")
    assert not report.hook.reachable and report.hook.allocator is None
    assert f"belongs to pid {other.pid}" in (report.hook.error or "")
    assert f"not to pid {target.pid}" in (report.hook.error or "")


def test_python_target_without_hook_is_told_about_the_autostart(spawn) -> None:
    report = diagnose(start_target(spawn, python_argv(), target_env("glibc")).pid)
    assert any("MEDIC_HOOK_SOCKET is not in its environment" in item for item in report.missing)
    assert any("medic hook install-pth" in item and "medic_hook" in item for item in report.missing)


def test_a_variable_without_a_serving_hook_is_explained(spawn, bins, sock_dir: str) -> None:
    env = target_env("glibc", f"{sock_dir}/h.%p.sock")  # the variable, but no shim loaded
    report = diagnose(start_target(spawn, [bins["target"]], env).pid)
    assert any("MEDIC_HOOK_DEBUG=1" in item for item in report.advice)


def test_static_jemalloc_without_exported_mallctl_is_told_about_rdynamic(spawn, bins) -> None:
    report = diagnose(start_target(spawn, [bins["stripped"]], target_env("glibc")).pid)
    assert any("-rdynamic" in item for item in report.advice)


def test_medic_doctor_cli_prints_json(spawn, bins) -> None:
    target = start_target(spawn, [bins["target"]], target_env("jemalloc"))
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "doctor", "--pid", str(target.pid), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["allocator"] == "jemalloc" and body["hook"]["reachable"] is False and body["advice"]


def test_medic_doctor_cli_on_a_vanished_pid_fails_in_one_line() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "doctor", "--pid", str(proc.pid)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
    )
    assert out.returncode != 0
    assert out.stderr.strip().count("\n") == 0 and "does not exist" in out.stderr
