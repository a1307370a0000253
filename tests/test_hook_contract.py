"""One contract suite for both hooks — the in-process Python hook and the LD_PRELOAD shim in a C
program — under Debian's real jemalloc and tcmalloc (LD_PRELOAD) and plain glibc.

Checks the issue's acceptance: figures are read, allocated bytes track a known allocation within 5 %,
a fragmenting workload shows resident far above allocated, purge lowers RSS, a jemalloc/tcmalloc heap
profile lands in a directory medic chose, and the hook survives garbage, disconnects, 1,000
requests, fork and multi-threaded allocation.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from native_hooks.client import HookClient
from native_hooks.errors import HookOpUnavailable
from native_hooks.purge import purge
from support.procs import REPO, wait_until
from support.workloads import TargetIO, build_c_target, python_argv, target_env

pytestmark = [pytest.mark.native, pytest.mark.slow]

MiB = 1024 * 1024
KINDS = ["python", "c"]
ALLOCATORS = ["glibc", "jemalloc", "tcmalloc"]
StartFn = Callable[..., tuple[TargetIO, str]]


def statm_rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


@pytest.fixture(scope="module")
def c_binary(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_c_target(tmp_path_factory.mktemp("bin"))


@pytest.fixture
def start(spawn, c_binary: str, sock_dir: str) -> StartFn:
    """`start(kind, allocator, **env)` -> (target, socket path); the child is reaped by `spawn`."""

    def _start(kind: str, allocator: str, **extra: str) -> tuple[TargetIO, str]:
        template = f"{sock_dir}/hook.%p.sock"
        env = target_env(allocator, template, shim=kind == "c", extra=extra)
        argv = [c_binary] if kind == "c" else python_argv()
        proc = spawn(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        target = TargetIO(proc)
        path = template.replace("%p", str(target.pid))
        wait_until(lambda: os.path.exists(path), timeout=5)
        return target, path

    return _start


def stats(path: str) -> dict:
    with HookClient(path, timeout=5) as client:
        return client.request("stats")


# -- figures -----------------------------------------------------------------------------------
@pytest.mark.parametrize("allocator", ALLOCATORS)
@pytest.mark.parametrize("kind", KINDS)
def test_stats_name_the_allocator_and_its_figures(start: StartFn, kind: str, allocator: str) -> None:
    target, path = start(kind, allocator)
    reply = stats(path)
    assert reply["ok"] is True
    assert reply["hook"] == ("python" if kind == "python" else "shim")
    assert reply["pid"] == target.pid
    assert reply["allocator"] == allocator
    expected = {"allocated", "resident", "mapped", "free"}
    if allocator != "glibc":
        expected |= {"active", "retained", "metadata", "purgeable"}
    assert expected <= set(reply["figures"])
    assert all(isinstance(v, int) and v >= 0 for v in reply["figures"].values())
    assert reply["process"]["rss_bytes"] > 0
    if kind == "python":
        assert reply["python"]["pymalloc"] is True
        assert reply["python"]["pymalloc_allocated_blocks"] > 0


@pytest.mark.parametrize("allocator", ALLOCATORS)
@pytest.mark.parametrize("kind", KINDS)
def test_allocated_tracks_a_known_allocation_within_5_percent(
    start: StartFn, kind: str, allocator: str
) -> None:
    target, path = start(kind, allocator)
    before = stats(path)["figures"]["allocated"]
    target.command(f"alloc 64 {MiB}")
    after = stats(path)["figures"]["allocated"]
    grown = after - before
    assert abs(grown - 64 * MiB) <= 0.05 * 64 * MiB, f"allocated grew {grown / MiB:.2f} MiB for 64 MiB"
    target.command("free")
    freed = stats(path)["figures"]["allocated"]
    assert abs(freed - before) <= 0.05 * 64 * MiB


@pytest.mark.parametrize("allocator", ALLOCATORS)
@pytest.mark.parametrize("kind", KINDS)
def test_fragmentation_shows_resident_far_above_allocated(start: StartFn, kind: str, allocator: str) -> None:
    target, path = start(kind, allocator)
    target.command("frag 100000 1024 16")  # 100 MB of 1 KiB blocks, every 16th kept
    figures = stats(path)["figures"]
    assert figures["resident"] - figures["allocated"] > 50 * MiB, figures
    assert figures["resident"] > 3 * figures["allocated"], figures


@pytest.mark.parametrize("allocator", ALLOCATORS)
@pytest.mark.parametrize("kind", KINDS)
def test_purge_returns_memory(start: StartFn, kind: str, allocator: str) -> None:
    target, path = start(kind, allocator)
    target.command("frag 100000 1024 64")  # 100 MB of 1 KiB blocks, every 64th kept: gaps span pages
    outside_before = statm_rss(target.pid)
    result = purge(path)
    outside_after = statm_rss(target.pid)
    assert result.allocator == allocator
    assert result.rss_after < result.rss_before
    assert result.returned_bytes > 20 * MiB, result
    assert outside_before - outside_after > 20 * MiB  # the kernel agrees


# -- heap profiles -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_jemalloc_heap_profile_is_dumped_where_medic_asks(start: StartFn, kind: str, tmp_path) -> None:
    target, path = start(kind, "jemalloc", MALLOC_CONF="prof:true,prof_active:false,lg_prof_sample:10")
    with HookClient(path, timeout=5) as client:
        assert client.request("prof_active", active=True)["previous"] is False
        target.command(f"alloc 16 {MiB}")
        dump = tmp_path / "medic-chosen" / "serving.heap"
        dump.parent.mkdir()
        reply = client.request("prof_dump", path=str(dump))
    assert reply["path"] == str(dump) and reply["format"] == "jemalloc"
    content = dump.read_bytes()
    assert content.startswith(b"heap_v2/1024")
    assert reply["bytes"] == len(content)
    assert b"MAPPED_LIBRARIES:" in content


@pytest.mark.parametrize("kind", KINDS)
def test_tcmalloc_heap_profile_is_dumped_where_medic_asks(start: StartFn, kind: str, tmp_path) -> None:
    target, path = start(kind, "tcmalloc")
    with HookClient(path, timeout=5) as client:
        client.request("prof_active", active=True, prefix=str(tmp_path / "tc"))
        target.command(f"alloc 8 {MiB}")
        dump = tmp_path / "serving.heap"
        reply = client.request("prof_dump", path=str(dump))
        client.request("prof_active", active=False)
    assert reply["format"] == "gperftools"
    assert dump.read_bytes().startswith(b"heap profile:")


@pytest.mark.parametrize("kind", KINDS)
def test_heap_profile_without_prof_enabled_says_how(start: StartFn, kind: str, tmp_path) -> None:
    _, path = start(kind, "jemalloc")
    with (
        HookClient(path, timeout=5) as client,
        pytest.raises(HookOpUnavailable, match="MALLOC_CONF=prof:true"),
    ):
        client.request("prof_dump", path=str(tmp_path / "x.heap"))


@pytest.mark.parametrize("kind", KINDS)
def test_glibc_has_no_heap_profiler_and_says_what_to_use(start: StartFn, kind: str, tmp_path) -> None:
    _, path = start(kind, "glibc")
    with HookClient(path, timeout=5) as client, pytest.raises(HookOpUnavailable, match="libjemalloc"):
        client.request("prof_dump", path=str(tmp_path / "x.heap"))


# -- robustness ----------------------------------------------------------------------------------
GARBAGE = [
    b"\n",
    b"garbage\n",
    b"\x00\xff\xfe\x01\n",
    b"[1, 2, 3]\n",
    b'"op"\n',
    b'{"op": 42}\n',
    b'{"op": "stats"\n',
    b'{"op": "stats"} trailing\n',
    b'{"op": "no_such_op"}\n',
    b'{"op": "prof_dump"}\n',
    b'{"op": "prof_dump", "path": "relative/x.heap"}\n',
    b'{"op": "prof_active"}\n',
    b'{"op": "ping", "x": ' + b"[" * 5000 + b"\n",
    b'{"op": "ping", "pad": "' + b"x" * 8000 + b'"}\n',
    b'{"op": "\\ud800"}\n',
    b'{"op": "ping", "n": NaN}\n',
]


@pytest.mark.parametrize("kind", KINDS)
def test_garbage_gets_error_replies_and_the_hook_keeps_serving(start: StartFn, kind: str) -> None:
    target, path = start(kind, "jemalloc")
    for payload in GARBAGE:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(5)
            conn.connect(path)
            conn.sendall(payload)
            reply = conn.recv(65536)
        assert reply.startswith(b'{"ok":false'), (payload[:40], reply[:200])
    with HookClient(path) as client:
        assert client.request("ping")["pong"] is True
    assert target.proc.poll() is None


@pytest.mark.parametrize("kind", KINDS)
def test_clients_that_disconnect_mid_request_do_no_harm(start: StartFn, kind: str) -> None:
    target, path = start(kind, "jemalloc")
    for _ in range(50):
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(path)
            conn.sendall(b'{"op": "sta')  # half a request, then gone
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(path)
            conn.sendall(b'{"op": "stats"}\n')  # a whole request, gone before the reply
    with HookClient(path) as client:
        assert client.request("ping")["pong"] is True
    assert target.proc.poll() is None


@pytest.mark.parametrize("kind", KINDS)
def test_a_thousand_requests_leak_no_fd_and_no_memory(start: StartFn, kind: str) -> None:
    target, path = start(kind, "jemalloc")
    for _ in range(50):  # warm up: first-use allocations in the hook thread
        stats(path)
    time.sleep(0.3)  # the hook closes its end of a connection when it sees the EOF
    fds, rss = fd_count(target.pid), statm_rss(target.pid)
    with HookClient(path) as client:
        for _ in range(500):
            client.request("stats")
    for _ in range(500):
        stats(path)  # a fresh connection each time
    wait_until(lambda: fd_count(target.pid) <= fds, timeout=3)
    assert statm_rss(target.pid) - rss < 1 * MiB


@pytest.mark.parametrize("kind", KINDS)
def test_a_forking_target_keeps_its_hook_and_the_child_does_not_steal_it(start: StartFn, kind: str) -> None:
    target, path = start(kind, "jemalloc")
    child = int(target.command("fork 1000"))
    child_path = path.replace(str(target.pid), str(child))
    with HookClient(path) as client:
        assert client.request("ping")["pid"] == target.pid
    if kind == "python":  # the Python hook serves a forked child on the child's own path
        wait_until(lambda: os.path.exists(child_path), timeout=5)
        with HookClient(child_path) as client:
            assert client.request("ping")["pid"] == child
    else:  # the shim's child closes the inherited socket and serves nothing
        time.sleep(0.2)
        assert not os.path.exists(child_path)
    assert target.command("reap") == "0"
    assert os.path.exists(path)
    with HookClient(path) as client:
        assert client.request("stats")["pid"] == target.pid


@pytest.mark.parametrize("kind", KINDS)
def test_probing_during_heavy_multithreaded_allocation(start: StartFn, kind: str) -> None:
    target, path = start(kind, "jemalloc")
    target.command("threads 4 1500")
    answered, errors = 0, []

    def probe() -> None:
        nonlocal answered
        deadline = time.monotonic() + 1.2
        with HookClient(path, timeout=5) as client:
            while time.monotonic() < deadline:
                try:
                    client.request("stats")
                    answered += 1
                except Exception as exc:  # collected and asserted below
                    errors.append(exc)

    prober = threading.Thread(target=probe)
    prober.start()
    prober.join()
    assert int(target.command("join")) > 0
    assert not errors
    assert answered >= 5  # the Python hook waits for the GIL behind 4 busy threads: tens of ms each
    assert target.proc.poll() is None


@pytest.mark.parametrize("kind", KINDS)
def test_socket_is_private(start: StartFn, kind: str) -> None:
    _, path = start(kind, "glibc")
    assert os.stat(path).st_mode & 0o777 == 0o600


@pytest.mark.root
@pytest.mark.parametrize("kind", KINDS)
def test_peers_of_another_uid_are_refused(start: StartFn, kind: str, spawn) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to connect as another user")
    _, path = start(kind, "glibc")
    os.chmod(path, 0o666)  # only SO_PEERCRED stands between nobody and the hook now
    os.chmod(os.path.dirname(path), 0o755)
    code = (
        "import os\n"
        "from native_hooks.client import HookClient\n"
        "os.setgid(65534); os.setuid(65534)\n"
        f"try:\n    HookClient({path!r}).request('stats')\n"
        "except Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=10, env=env)
    assert out.stdout.startswith("HookAccessDenied"), out.stdout + out.stderr
    assert "uid" in out.stdout
