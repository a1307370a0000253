"""Hook socket conventions on real files and processes: binding with mode 0600, finding a target's
socket through its environment, and removing sockets of processes that are gone."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pytest

from native_hooks.sockets import (
    STALE_GRACE_SECONDS,
    SocketPathError,
    bind_listener,
    candidate_paths,
    find_socket,
    is_live,
    namespace_pids,
    remove_if_stale,
    remove_stale_sockets,
)


def test_bind_listener_is_private_and_creates_its_directory(sock_dir: str) -> None:
    path = f"{sock_dir}/new/h.sock"
    listener = bind_listener(path)
    try:
        assert os.stat(path).st_mode & 0o777 == 0o600
        assert os.stat(f"{sock_dir}/new").st_mode & 0o777 == 0o700
        assert is_live(path)
        assert os.listdir(f"{sock_dir}/new") == ["h.sock"]  # no staging directory left behind
    finally:
        listener.close()
    assert not is_live(path)  # bound but nobody listening: refused


def test_bind_listener_replaces_stale_refuses_live_and_files(sock_dir: str) -> None:
    path = f"{sock_dir}/h.sock"
    first = bind_listener(path)
    with pytest.raises(FileExistsError):
        bind_listener(path)
    first.close()
    second = bind_listener(path)  # the stale one is replaced
    second.close()
    with open(f"{sock_dir}/file", "w") as f:
        f.write("keep me")
    with pytest.raises(SocketPathError, match="not a socket"):
        bind_listener(f"{sock_dir}/file")


def test_find_socket_reads_the_targets_own_template(spawn, sock_dir: str) -> None:
    template = f"{sock_dir}/custom.%p.sock"
    proc = spawn(["sleep", "30"], env={**os.environ, "MEDIC_HOOK_SOCKET": template})
    assert find_socket(proc.pid) is None
    path = template.replace("%p", str(proc.pid))
    listener = bind_listener(path)
    try:
        assert candidate_paths(proc.pid)[0] == path
        assert find_socket(proc.pid) == path
    finally:
        listener.close()


def test_find_socket_falls_back_to_the_conventional_directory(spawn, sock_dir: str) -> None:
    proc = spawn(["sleep", "30"], env={**os.environ, "MEDIC_HOOK_DIR": sock_dir})
    listener = bind_listener(f"{sock_dir}/hook.{proc.pid}.sock")
    try:
        assert find_socket(proc.pid) == f"{sock_dir}/hook.{proc.pid}.sock"
    finally:
        listener.close()
    assert namespace_pids(proc.pid) == {proc.pid}


def test_remove_stale_sockets(sock_dir: str) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    live_listener = bind_listener(f"{sock_dir}/hook.{os.getpid()}.sock")
    stale_dead = f"{sock_dir}/hook.{dead.pid}.sock"
    young_refused = f"{sock_dir}/hook.1.sock"  # pid 1 is alive: maybe between bind() and listen()
    for path in (stale_dead, young_refused):
        leftover = socket.socket(socket.AF_UNIX)
        leftover.bind(path)
        leftover.close()
    with open(f"{sock_dir}/hook.999999.sock", "w") as f:
        f.write("a file with a socket's name is left alone")
    try:
        assert remove_stale_sockets([sock_dir]) == [stale_dead]
        assert os.path.exists(young_refused)
        later = time.time() + STALE_GRACE_SECONDS + 1
        assert remove_stale_sockets([sock_dir], now=later) == [young_refused]
        assert os.path.exists(f"{sock_dir}/hook.{os.getpid()}.sock")
        assert os.path.exists(f"{sock_dir}/hook.999999.sock")
    finally:
        live_listener.close()


def test_remove_if_stale_takes_only_a_dead_process_s_refusing_socket(sock_dir: str) -> None:
    """What the agent does when a process it followed is gone (TERM-stopped targets keep their socket)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{sock_dir}/custom.{dead.pid}.sock"  # any name: the path the process answered on
    leftover = socket.socket(socket.AF_UNIX)
    leftover.bind(stale)
    leftover.close()
    live = bind_listener(f"{sock_dir}/hook.{dead.pid}.sock")
    with open(f"{sock_dir}/file.sock", "w") as f:
        f.write("not a socket")
    try:
        assert remove_if_stale(f"{sock_dir}/hook.{dead.pid}.sock", dead.pid) is False  # it listens
        assert remove_if_stale(f"{sock_dir}/file.sock", dead.pid) is False
        assert remove_if_stale(f"{sock_dir}/missing.sock", dead.pid) is False
        young = f"{sock_dir}/young.sock"
        other = socket.socket(socket.AF_UNIX)
        other.bind(young)
        other.close()
        assert remove_if_stale(young, 1) is False  # pid 1 lives: maybe between bind() and listen()
        assert remove_if_stale(young, 1, now=time.time() + STALE_GRACE_SECONDS + 1) is True
        assert remove_if_stale(stale, dead.pid) is True and not os.path.exists(stale)
        assert os.path.exists(f"{sock_dir}/file.sock")
    finally:
        live.close()
