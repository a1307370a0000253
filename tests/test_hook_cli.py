"""`medic hook` subcommands end to end: env, call (by pid and by socket), clean, and their errors."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import pytest
from conftest import REPO

from agent.cli.hook import parse_params
from agent.errors import UsageError
from native_hooks.workloads import TargetIO, ensure_shim, python_argv, target_env


def medic(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=30,
        env=env,
    )


@pytest.fixture
def sock_dir() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="mc-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.native
def test_env_prints_what_a_native_jemalloc_target_needs() -> None:
    out = medic("hook", "env", "--allocator", "jemalloc")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"LD_PRELOAD=libjemalloc.so.2:{ensure_shim()}",
        "MEDIC_HOOK_SOCKET=auto",
        "MALLOC_CONF=prof:true,prof_active:false",
    ]
    python = medic("hook", "env", "--python").stdout
    assert "LD_PRELOAD" not in python and "MEDIC_HOOK_SOCKET=auto" in python and "install-pth" in python


@pytest.mark.slow
def test_call_by_pid_and_by_socket(spawn, sock_dir: str) -> None:
    env = target_env("glibc", "auto", extra={"MEDIC_HOOK_DIR": sock_dir})
    proc = spawn(python_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    target = TargetIO(proc)
    by_pid = medic("hook", "call", "histogram", "top=3", "--pid", str(target.pid), env={**os.environ, **env})
    assert by_pid.returncode == 0, by_pid.stderr
    assert len(json.loads(by_pid.stdout)["types"]) == 3
    path = f"{sock_dir}/hook.{target.pid}.sock"
    bad = medic("hook", "call", "prof_dump", "path=/tmp/x.heap", "--socket", path)
    assert bad.returncode != 0 and "glibc malloc has no heap profiler" in bad.stderr
    assert bad.stderr.count("\n") == 1


def test_call_without_a_hook_says_how_to_get_one() -> None:
    out = medic("hook", "call", "ping", "--pid", str(os.getpid()))
    assert out.returncode != 0 and "MEDIC_HOOK_SOCKET=auto" in out.stderr


def test_clean_removes_only_stale_sockets(sock_dir: str) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(f"{sock_dir}/hook.{dead.pid}.sock")
    stale.close()
    out = medic("hook", "clean", "--json", env={**os.environ, "MEDIC_HOOK_DIR": sock_dir})
    assert out.returncode == 0, out.stderr
    assert f"{sock_dir}/hook.{dead.pid}.sock" in json.loads(out.stdout)["removed"]
    assert not os.path.exists(f"{sock_dir}/hook.{dead.pid}.sock")


def test_parse_params() -> None:
    assert parse_params(["top=5", "path=/x.heap", "active=true", "name=a=b"]) == {
        "top": 5,
        "path": "/x.heap",
        "active": True,
        "name": "a=b",
    }
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_params(["novalue"])
