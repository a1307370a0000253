"""`medic hook` subcommands end to end: env, call (by pid and by socket), clean, and their errors."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import pytest

from agent.cli.hook import parse_params
from agent.core.errors import UsageError
from support.agent_runner import medic_cli
from support.workloads import TargetIO, ensure_shim, python_argv, target_env


@pytest.mark.native
def test_env_prints_what_a_native_jemalloc_target_needs() -> None:
    out = medic_cli("hook", "env", "--allocator", "jemalloc")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"LD_PRELOAD=libjemalloc.so.2:{ensure_shim()}",
        "MEDIC_HOOK_SOCKET=auto",
        "MALLOC_CONF=prof:true,prof_active:false",
    ]
    python = medic_cli("hook", "env", "--python").stdout
    assert "LD_PRELOAD" not in python and "MEDIC_HOOK_SOCKET=auto" in python and "install-pth" in python


@pytest.mark.slow
def test_call_by_pid_and_by_socket(spawn, sock_dir: str) -> None:
    env = target_env("glibc", "auto", extra={"MEDIC_HOOK_DIR": sock_dir})
    proc = spawn(python_argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    target = TargetIO(proc)
    by_pid = medic_cli("hook", "call", "histogram", "top=3", "--pid", str(target.pid), env=env)
    assert by_pid.returncode == 0, by_pid.stderr
    assert len(json.loads(by_pid.stdout)["types"]) == 3
    path = f"{sock_dir}/hook.{target.pid}.sock"
    bad = medic_cli("hook", "call", "prof_dump", "path=/tmp/x.heap", "--socket", path)
    assert bad.returncode != 0 and "glibc malloc has no heap profiler" in bad.stderr
    assert bad.stderr.count("\n") == 1
    # the documented order: options first, KEY=VALUE after them (argparse alone refused this)
    after = medic_cli(
        "hook",
        "call",
        "histogram",
        "--pid",
        str(target.pid),
        "top=2",
        "contents=0",
        env=env,
    )
    assert after.returncode == 0, after.stderr
    assert len(json.loads(after.stdout)["types"]) == 2
    mixed = medic_cli("hook", "call", "--pid", str(target.pid), "stats", "detail=true", env=env)
    assert mixed.returncode == 0, mixed.stderr
    assert "malloc_info" in json.loads(mixed.stdout)


def test_call_without_a_hook_says_how_to_get_one() -> None:
    out = medic_cli("hook", "call", "ping", "--pid", str(os.getpid()))
    assert out.returncode != 0 and "MEDIC_HOOK_SOCKET=auto" in out.stderr


def test_clean_removes_only_stale_sockets(sock_dir: str) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(f"{sock_dir}/hook.{dead.pid}.sock")
    stale.close()
    out = medic_cli("hook", "clean", "--json", env={"MEDIC_HOOK_DIR": sock_dir})
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


# A hook-like server that answers every request with its pid. `bind-then-drop` binds as root (the
# socket file is root's) and listens as nobody; `as-nobody` does both as nobody (nobody owns the file).
FAKE_HOOK = r"""
import os, socket, sys
path, mode = sys.argv[1], sys.argv[2]
server = socket.socket(socket.AF_UNIX)
if mode == "as-nobody":
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)
server.bind(path)
if mode == "bind-then-drop":
    os.setresgid(65534, 65534, 65534)
    os.setresuid(65534, 65534, 65534)
server.listen(4)
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    try:
        if conn.recv(4096):  # a client that refused us sends nothing
            conn.sendall(b'{"ok": true, "pid": %d}\n' % os.getpid())
    except OSError:
        pass
    conn.close()
"""


@pytest.mark.root
@pytest.mark.parametrize(("mode", "trusted"), [("as-nobody", True), ("bind-then-drop", False)])
def test_call_by_socket_trusts_only_root_medic_or_the_socket_owner(
    spawn, sock_dir: str, mode, trusted
) -> None:
    """Without --pid, the server's uid (SO_PEERCRED) must be root, medic's, or the socket file's owner."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run the server as another user")
    os.chmod(sock_dir, 0o777)
    path = f"{sock_dir}/hook.sock"
    server = spawn([sys.executable, "-c", FAKE_HOOK, path, mode], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline() == "ready\n"
    out = medic_cli("hook", "call", "ping", "--socket", path)
    if trusted:
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["pid"] == server.pid
    else:
        assert out.returncode != 0 and out.stdout == ""
        assert "uid 65534" in out.stderr and "socket file belongs to uid 0" in out.stderr
        assert "--pid PID" in out.stderr and out.stderr.count("\n") == 1


@pytest.mark.root
def test_call_with_pid_and_socket_refuses_another_process_s_socket(spawn, sock_dir: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to run the server as another user")
    os.chmod(sock_dir, 0o777)
    path = f"{sock_dir}/hook.sock"
    server = spawn([sys.executable, "-c", FAKE_HOOK, path, "as-nobody"], stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None and server.stdout.readline() == "ready\n"
    out = medic_cli("hook", "call", "ping", "--socket", path, "--pid", str(os.getpid()))
    assert out.returncode != 0 and f"belongs to pid {server.pid}" in out.stderr
    assert medic_cli("hook", "call", "ping", "--socket", path, "--pid", str(server.pid)).returncode == 0


def test_call_needs_a_pid_or_a_socket() -> None:
    out = medic_cli("hook", "call", "ping")
    assert out.returncode != 0 and "--pid PID" in out.stderr and "Traceback" not in out.stderr


def test_clean_escapes_control_characters_in_what_it_prints() -> None:
    directory = tempfile.mkdtemp(prefix="mc-\x1b]0;owned\x07-", dir="/tmp")
    try:
        dead = subprocess.Popen(["true"])
        dead.wait()
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(f"{directory}/hook.{dead.pid}.sock")
        stale.close()
        out = medic_cli("hook", "clean", env={"MEDIC_HOOK_DIR": directory})
        assert out.returncode == 0, out.stderr
        assert "\x1b" not in out.stdout and "\x07" not in out.stdout
        assert "mc-\\x1b]0;owned\\x07-" in out.stdout and f"hook.{dead.pid}.sock" in out.stdout
    finally:
        shutil.rmtree(directory, ignore_errors=True)
