"""The LD_PRELOAD shim on its own: build, no effect when unused, allocator choice by `dladdr`, socket
rules (%p, auto, stale sockets, exec chains), and a fuzz of its C request parser through the socket."""

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
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from native_hooks.client import HookClient, request
from native_hooks.shim import shim_path
from support.native import build_native_bins, start_target
from support.procs import REPO, wait_until
from support.workloads import TargetIO, ensure_shim, target_env

pytestmark = pytest.mark.native


@pytest.fixture(scope="module")
def shim() -> str:
    return ensure_shim()


@pytest.fixture(scope="module")
def bins(tmp_path_factory: pytest.TempPathFactory, shim: str) -> dict[str, str]:
    return build_native_bins(tmp_path_factory.mktemp("shim-bins"))


def test_shim_path_names_the_built_library_which_exports_one_symbol(shim: str) -> None:
    assert shim_path() == shim and os.path.isabs(shim)
    symbols = subprocess.run(["nm", "-D", "--defined-only", shim], capture_output=True, text=True, check=True)
    assert [line.split()[-1] for line in symbols.stdout.splitlines()] == ["medic_shim_socket_path"]
    needed = subprocess.run(["readelf", "-d", shim], capture_output=True, text=True, check=True).stdout
    assert "libpython" not in needed  # a plain library: loadable into any native process


def test_medic_hook_path_prints_it(shim: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "hook", "path"], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == shim


def test_without_the_variable_the_shim_does_nothing(spawn, bins: dict[str, str], shim: str) -> None:
    env = target_env("jemalloc")
    plain = start_target(spawn, [bins["target"]], env)
    env["LD_PRELOAD"] += ":" + shim
    shimmed = start_target(spawn, [bins["target"]], env)
    for target in (plain, shimmed):
        target.command("alloc 10 4096")
    assert len(os.listdir(f"/proc/{shimmed.pid}/task")) == len(os.listdir(f"/proc/{plain.pid}/task")) == 1
    assert len(os.listdir(f"/proc/{shimmed.pid}/fd")) == len(os.listdir(f"/proc/{plain.pid}/fd"))


def test_server_thread_is_named_and_blocks_signals(spawn, bins: dict[str, str], sock_dir: str) -> None:
    target = start_target(spawn, [bins["target"]], target_env("glibc", f"{sock_dir}/h.%p.sock", shim=True))
    tasks = [t for t in os.listdir(f"/proc/{target.pid}/task") if int(t) != target.pid]
    assert len(tasks) == 1
    with open(f"/proc/{target.pid}/task/{tasks[0]}/comm") as f:
        assert f.read().strip() == "medic-hook"
    with open(f"/proc/{target.pid}/task/{tasks[0]}/status") as f:
        blocked = next(line for line in f if line.startswith("SigBlk:")).split()[1]
    standard = (1 << 31) - 1  # signals 1-31; glibc keeps its internal 32 and 33 unblockable
    unblockable = (1 << (9 - 1)) | (1 << (19 - 1))  # SIGKILL, SIGSTOP
    assert (int(blocked, 16) & standard) | unblockable == standard  # every signal stays with the host


@pytest.mark.parametrize(
    ("name", "expected"),
    [("static", "unknown"), ("rdynamic", "jemalloc")],
)
def test_a_static_allocator_is_served_only_when_it_exports_mallctl(
    spawn, bins: dict[str, str], sock_dir: str, name: str, expected: str
) -> None:
    target = start_target(spawn, [bins[name]], target_env("glibc", f"{sock_dir}/h.%p.sock", shim=True))
    reply = request(f"{sock_dir}/h.{target.pid}.sock", "stats")
    assert reply["allocator"] == expected  # never glibc's zeros for an allocator that is not glibc
    if expected == "unknown":
        assert reply["figures"] == {}
        with pytest.raises(Exception, match="cannot drive"):
            request(f"{sock_dir}/h.{target.pid}.sock", "purge")


def test_a_mapped_but_unused_jemalloc_is_not_reported(spawn, bins: dict[str, str], sock_dir: str) -> None:
    env = target_env("glibc", f"{sock_dir}/h.%p.sock", shim=True)
    env["LD_PRELOAD"] = (
        f"{bins['libfoo']}:{env['LD_PRELOAD']}"  # libfoo needs libjemalloc; malloc stays glibc's
    )
    target = start_target(spawn, [bins["target"]], env)
    with open(f"/proc/{target.pid}/maps") as f:
        assert "libjemalloc" in f.read()
    assert request(f"{sock_dir}/h.{target.pid}.sock", "stats")["allocator"] == "glibc"


def test_auto_uses_the_conventional_directory(spawn, bins: dict[str, str], sock_dir: str) -> None:
    env = target_env("glibc", "auto", shim=True, extra={"MEDIC_HOOK_DIR": f"{sock_dir}/run"})
    target = start_target(spawn, [bins["target"]], env)
    path = f"{sock_dir}/run/hook.{target.pid}.sock"
    wait_until(lambda: os.path.exists(path))
    assert os.stat(f"{sock_dir}/run").st_mode & 0o777 == 0o700
    assert request(path, "ping")["pid"] == target.pid
    target.exit()
    assert not os.path.exists(path)  # unlinked by the destructor of the process that bound it


def test_an_exec_chain_rebinds_the_same_pid(spawn, bins: dict[str, str], sock_dir: str) -> None:
    """Like pyenv's bash shim: the shell binds hook.<pid>.sock, then execs the program with the same
    pid; the program replaces the stale socket."""
    env = target_env("glibc", f"{sock_dir}/h.%p.sock", shim=True)
    target = start_target(spawn, ["/bin/sh", "-c", f"exec {bins['target']}"], env)
    assert request(f"{sock_dir}/h.{target.pid}.sock", "stats")["allocator"] == "glibc"


def test_a_path_without_pid_is_not_stolen_by_children(spawn, bins: dict[str, str], sock_dir: str) -> None:
    path = f"{sock_dir}/fixed.sock"
    parent = start_target(spawn, [bins["target"]], target_env("glibc", path, shim=True))
    # a child process that inherits the variable finds the socket live and stays quiet
    child = start_target(spawn, [bins["target"]], target_env("glibc", path, shim=True))
    assert child.pid != parent.pid
    assert request(path, "ping")["pid"] == parent.pid


def test_a_stale_socket_is_replaced_but_a_regular_file_is_not(
    spawn, bins: dict[str, str], sock_dir: str
) -> None:
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(f"{sock_dir}/stale.sock")
    stale.close()  # bound, never listening: connect() is refused
    target = start_target(spawn, [bins["target"]], target_env("glibc", f"{sock_dir}/stale.sock", shim=True))
    assert request(f"{sock_dir}/stale.sock", "ping")["pid"] == target.pid
    with open(f"{sock_dir}/file.sock", "w") as f:
        f.write("not a socket")
    other = start_target(spawn, [bins["target"]], target_env("glibc", f"{sock_dir}/file.sock", shim=True))
    other.command("alloc 1 4096")  # runs normally
    with open(f"{sock_dir}/file.sock") as f:
        assert f.read() == "not a socket"


@pytest.mark.parametrize(
    "value", ["relative/h.sock", "/nonexistent-dir/sub/h.sock", "/tmp/" + "x" * 120 + ".sock"]
)
def test_unusable_socket_paths_leave_the_target_alone(spawn, bins: dict[str, str], value: str) -> None:
    env = target_env("glibc", value, shim=True, extra={"MEDIC_HOOK_DEBUG": "1"})
    proc = spawn(
        [bins["target"]],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    target = TargetIO(proc)
    target.command("alloc 4 4096")
    assert target.exit() == 0
    assert "medic shim" in proc.stderr.read()  # MEDIC_HOOK_DEBUG says why


# -- the C request parser, through the socket ------------------------------------------------------
@pytest.fixture(scope="module")
def live_shim(bins: dict[str, str]) -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="mf-", dir="/tmp")
    env = target_env("jemalloc", f"{directory}/h.%p.sock", shim=True)
    proc = subprocess.Popen(
        [bins["target"]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        target = TargetIO(proc)
        yield f"{directory}/h.{target.pid}.sock"
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            stream.close()
        shutil.rmtree(directory, ignore_errors=True)


def _raw(path: str, payload: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(5)
        conn.connect(path)
        conn.sendall(payload)
        data = b""
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    extra=st.dictionaries(st.text(max_size=12).filter(lambda k: k not in ("op",)), json_values, max_size=5)
)
def test_any_valid_ping_object_gets_a_pong(live_shim: str, extra: dict) -> None:
    line = json.dumps({**extra, "op": "ping"}) + "\n"
    reply = json.loads(_raw(live_shim, line.encode()))
    assert reply["ok"] is True and reply["pong"] is True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=st.binary(max_size=600).filter(lambda b: b"\n" not in b))
def test_arbitrary_bytes_get_one_json_reply(live_shim: str, payload: bytes) -> None:
    reply = json.loads(_raw(live_shim, payload + b"\n"))
    assert isinstance(reply["ok"], bool)
    assert reply["ok"] or reply["code"] in ("bad_request", "unknown_op", "too_large")


def test_escapes_in_strings_are_decoded(live_shim: str) -> None:
    reply = json.loads(_raw(live_shim, b'{"\\u006fp": "p\\u0069ng"}\n'))
    assert reply["pong"] is True
    reply = json.loads(_raw(live_shim, b'{"op": "p\\u00efng \\ud83d\\ude00 \\"x\\""}\n'))
    assert reply["code"] == "unknown_op"


def test_several_requests_in_one_write_get_replies_in_order(live_shim: str) -> None:
    with HookClient(live_shim) as client:
        client.request("ping")  # connection open
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(5)
        conn.connect(live_shim)
        conn.sendall(b'{"op":"ping"}\n{"op":"nope"}\n{"op":"stats"}\n')
        data = b""
        while data.count(b"\n") < 3:
            data += conn.recv(65536)
    replies = [json.loads(line) for line in data.splitlines()]
    assert [r.get("op", r.get("code")) for r in replies] == ["ping", "unknown_op", "stats"]


def test_an_oversized_line_is_refused_and_the_connection_goes_on(live_shim: str) -> None:
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(5)
        conn.connect(live_shim)
        conn.sendall(b'{"op": "ping", "pad": "' + b"x" * 10000 + b'"}\n{"op": "ping"}\n')
        data = b""
        while data.count(b"\n") < 2:
            data += conn.recv(65536)
    first, second = (json.loads(line) for line in data.splitlines())
    assert first["code"] == "too_large"
    assert second["pong"] is True
