"""The in-process hook for Python targets (`medic_hook`): handlers, the server thread,
start/stop/autostart, the .pth route, and the histogram's limits. (Behaviour under real allocators is
in test_hook_contract.py; what the hook may import and leave behind, in test_security_hook.py.)"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

import medic_hook
from agent.cli.hook import PTH_LINE
from medic_hook import SocketPathError
from native_hooks import protocol
from native_hooks.client import HookClient
from native_hooks.errors import HookOpUnavailable, HookRequestError
from support.procs import REPO, wait_until


@pytest.fixture
def server(sock_dir: str) -> Iterator[medic_hook.HookServer]:
    hook = medic_hook.HookServer(f"{sock_dir}/h.%p.sock")
    hook.start()
    yield hook
    hook.stop()


def test_ping_stats_and_histogram_through_the_socket(server: medic_hook.HookServer) -> None:
    with HookClient(server.path, 30.0) as client:
        ping = client.request("ping")
        stats = client.request("stats", detail=True)
        histogram = client.request("histogram", top=5)
    assert ping["pong"] is True and ping["pid"] == os.getpid() and "histogram" in ping["ops"]
    assert stats["allocator"] == "glibc" and stats["hook"] == "python"
    assert stats["malloc_info"]["heaps"] >= 1  # detail=true adds glibc's malloc_info summary
    assert stats["python"]["threads"] >= 2 and len(stats["python"]["gc_counts"]) == 3
    assert len(histogram["types"]) == 5 and histogram["objects"] > 1000
    assert histogram["types"][0]["count"] >= histogram["types"][-1]["count"]


def test_histogram_counts_a_known_class(server: medic_hook.HookServer) -> None:
    class Leaky:
        pass

    kept = [Leaky() for _ in range(5000)]
    with HookClient(server.path, 30.0) as client:
        # the whole heap of a worker that ran other tests first: within the default 1 s of CPU the walk
        # may cover part of it and scale its counts up (5002), so the most budget a request may ask
        reply = client.request("histogram", top=50, budget_s=10)
    assert reply["sample_fraction"] == 1, reply["sample_fraction"]  # every object walked: exact counts
    row = next(r for r in reply["types"] if r["type"].endswith("Leaky"))
    assert row["count"] == len(kept) and row["bytes"] >= 5000 * 16


def test_histogram_referents_add_untracked_objects(server: medic_hook.HookServer) -> None:
    class Slotted:
        __slots__ = ("payload",)

        def __init__(self, payload: bytes) -> None:
            self.payload = payload

    # bytes are not tracked by gc; held in the slots of tracked objects, nor are they counted
    kept = [Slotted(b"x" * 100 + str(i).encode()) for i in range(20000)]
    with HookClient(server.path, 30.0) as client:  # a 10 s budget of CPU may take longer on a busy host
        plain = {r["type"]: r["count"] for r in client.request("histogram", top=200)["types"]}
        # the walk covers the whole test process: its time budget at the most, for a loaded machine
        deep = client.request("histogram", top=200, referents=True, budget_s=10)["types"]
        deep = {r["type"]: r["count"] for r in deep}
    # the walk of referents adds every kept payload to what the plain walk saw (which, in a worker
    # that ran other tests first, may include their modules' bytes)
    assert deep["bytes"] - plain.get("bytes", 0) >= len(kept)


def test_a_heap_past_max_objects_is_sampled_and_a_budget_too_small_for_one_pass_refused(
    server: medic_hook.HookServer,
) -> None:
    class Kept:
        pass

    kept = [Kept() for _ in range(300_000)]
    with HookClient(server.path, 30.0) as client:
        sampled = client.request("histogram", max_objects=20_000, top=50)
        assert sampled["walked"] <= 20_000 and sampled["sample_fraction"] < 0.1
        count = next(r["count"] for r in sampled["types"] if r["type"].endswith("Kept"))
        assert 0.9 * len(kept) < count < 1.1 * len(kept)  # every 17th object, scaled back up
        with pytest.raises(HookOpUnavailable, match=r"histograms\.python\.budget"):
            client.request("histogram", budget_s=0.001)
        assert client.request("ping")["pong"] is True
    del kept


@pytest.mark.parametrize(
    "params",
    [
        {"top": 0},
        {"top": "5"},
        {"top": True},
        {"budget_s": 11},
        {"max_objects": -1},
        {"wall_s": 0},
        {"wall_s": 61},
    ],
)
def test_histogram_parameters_are_validated(server: medic_hook.HookServer, params: dict) -> None:
    with HookClient(server.path, 30.0) as client, pytest.raises(HookRequestError, match="must be"):
        client.request("histogram", **params)


def test_handlers_never_raise_into_the_server() -> None:
    def boom(request: dict) -> dict:
        raise RuntimeError("kaboom")

    def system_exit(request: dict) -> dict:
        raise KeyError("missing")

    handlers = {"boom": boom, "key": system_exit}
    assert medic_hook.handle_line(b'{"op": "boom"}', handlers) == protocol.error_reply(
        "failed", "RuntimeError: kaboom"
    )
    assert medic_hook.handle_line(b'{"op": "key"}', handlers)["code"] == "failed"
    assert medic_hook.handle_line(b'{"op": "ping"}', handlers)["code"] == "unknown_op"
    assert medic_hook.handle_line(b"\xff", handlers)["code"] == "bad_request"


def test_prof_dump_needs_an_absolute_path() -> None:
    reply = medic_hook.handle_line(b'{"op": "prof_dump", "path": "x.heap"}')
    assert reply["code"] == "bad_request" and "absolute" in reply["error"]
    reply = medic_hook.handle_line(b'{"op": "prof_active", "active": "yes"}')
    assert reply["code"] == "bad_request"


def test_purge_reports_rss_before_and_after(server: medic_hook.HookServer) -> None:
    with HookClient(server.path, 30.0) as client:
        reply = client.request("purge", gc=True)
    assert reply["action"] == "malloc_trim(0)" and reply["gc_collected"] is not None
    assert reply["rss_before"] > 0 and reply["returned_bytes"] == max(
        0, reply["rss_before"] - reply["rss_after"]
    )


def test_an_oversized_request_is_refused_and_the_rest_of_its_line_skipped(
    server: medic_hook.HookServer,
) -> None:
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(5)
        conn.connect(server.path)
        conn.sendall(b'{"op": "ping", "pad": "' + b"x" * 10000 + b'"}\n{"op": "ping"}\n')
        data = b""
        while data.count(b"\n") < 2:
            data += conn.recv(65536)
    first, second = (json.loads(line) for line in data.splitlines())
    assert first["code"] == "too_large"
    assert second["pong"] is True  # the connection goes on with the next line


def test_more_clients_than_slots_evict_the_idle_ones(server: medic_hook.HookServer) -> None:
    idle = [socket.socket(socket.AF_UNIX) for _ in range(medic_hook.MAX_CLIENTS + 4)]
    for conn in idle:
        conn.connect(server.path)
    with HookClient(server.path, 30.0) as client:
        assert client.request("ping")["pong"] is True
    for conn in idle:
        conn.close()


def test_stop_removes_the_socket_and_ends_the_thread(sock_dir: str) -> None:
    hook = medic_hook.HookServer(f"{sock_dir}/h.sock")
    hook.start()
    assert os.stat(hook.path).st_mode & 0o777 == 0o600
    hook.stop()
    assert not os.path.exists(hook.path)
    assert hook._thread is not None and not hook._thread.is_alive()


def test_a_live_socket_is_not_taken_over(server: medic_hook.HookServer) -> None:
    with pytest.raises(FileExistsError):
        medic_hook.HookServer(server.path).start()


def test_a_directory_of_another_user_is_refused(sock_dir: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a directory owned by someone else")
    other = f"{sock_dir}/theirs"
    os.mkdir(other)
    os.chown(other, 65534, 65534)
    with pytest.raises(SocketPathError, match="belongs to uid 65534"):
        medic_hook.HookServer(f"{other}/h.sock").start()


def test_module_start_is_idempotent_and_stop_cleans_up(sock_dir: str) -> None:
    path = medic_hook.start(f"{sock_dir}/m.%p.sock")
    try:
        assert path == f"{sock_dir}/m.{os.getpid()}.sock"
        assert medic_hook.start("/elsewhere/ignored.sock") == path
        assert medic_hook.running_path() == path
    finally:
        medic_hook.stop()
    assert medic_hook.running_path() is None and not os.path.exists(path)


def test_autostart_without_the_variable_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MEDIC_HOOK_SOCKET", raising=False)
    assert medic_hook.autostart() is None


def test_autostart_with_a_bad_path_never_raises(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setenv("MEDIC_HOOK_SOCKET", "not/absolute")
    monkeypatch.setenv("MEDIC_HOOK_DEBUG", "1")
    assert medic_hook.autostart() is None
    assert "must be absolute" in capsys.readouterr().err


def _python(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=30)


def test_a_pth_file_autostarts_the_hook_at_interpreter_start(sock_dir: str, tmp_path) -> None:
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    out = _python(
        ["-m", "agent.cli.main", "hook", "install-pth", "--dir", str(site_dir)],
        {**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert out.returncode == 0, out.stderr
    assert (site_dir / "medic-hook.pth").read_text() == PTH_LINE
    code = (
        f"import site; site.addsitedir({str(site_dir)!r})\n"  # what site-packages gets at start-up
        "import sys; hook = sys.modules.get('medic_hook'); print(hook.running_path() if hook else None)"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO), "MEDIC_HOOK_SOCKET": f"{sock_dir}/p.%p.sock"}
    started = _python(["-c", code], env)
    assert started.stdout.strip().startswith(f"{sock_dir}/p.") and started.stdout.strip().endswith(".sock")
    env.pop("MEDIC_HOOK_SOCKET")
    assert _python(["-c", code], env).stdout.strip() == "None"


def test_the_socket_disappears_when_the_target_exits(spawn, sock_dir: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "MEDIC_HOOK_SOCKET": f"{sock_dir}/e.%p.sock"}
    code = "import medic_hook, sys; medic_hook.autostart(); print('up', flush=True); sys.stdin.readline()"
    proc = spawn(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout.readline().strip() == "up"
    path = f"{sock_dir}/e.{proc.pid}.sock"
    wait_until(lambda: os.path.exists(path))
    proc.stdin.write("\n")
    proc.stdin.flush()
    assert proc.wait(timeout=10) == 0
    assert not os.path.exists(path)


def test_a_list_of_untracked_dicts_shows_as_dicts_and_their_contents(server: medic_hook.HookServer) -> None:
    """Dicts holding only numbers, strings and None are not tracked by the GC: a history list of such
    records (the usual Python list leak) shows its dicts and what they hold, singletons left out."""
    import gc

    history = [{"id": i, "score": i / 7, "tag": None} for i in range(30000)]
    assert not gc.is_tracked(history[0])
    with HookClient(server.path, 30.0) as client:
        reply = client.request("histogram", top=50, budget_s=10)  # the whole worker, on a busy host
    types = {row["type"]: row for row in reply["types"]}
    assert types["dict"]["count"] >= len(history) and types["float"]["count"] >= len(history)
    assert types.get("NoneType", {"count": 0})["count"] < 100
    listed = next(c for c in reply["containers"] if c["type"] == "list" and c["len"] == len(history))
    assert listed["holds"] == "dict" and listed["complete"] and listed["content_bytes"] > 30000 * 64


def test_an_allocation_in_the_standard_library_is_named_by_the_line_that_called_it() -> None:
    """`random.randrange` makes the int a record keeps: the site is the application's line."""
    import random
    import tracemalloc

    from medic_hook import sites

    started = sites.start(frames=4, duration_s=60, max_memory=16 * 2**20)
    assert started["tracing"]
    try:
        rng = random.Random(1)
        kept = [rng.randrange(2**40, 2**41) for _ in range(20000)]  # the kept ints
        line = f"{__file__}:{sys._getframe().f_lineno - 1}"
        rows = sites.snapshot(top=20)["sites"]
    finally:
        sites.stop()
    assert not tracemalloc.is_tracing() and len(kept) == 20000
    names = [row["site"] for row in rows]
    assert line in names and not [n for n in names if n.endswith(os.sep + "random.py") or "random.py:" in n]
    row = next(r for r in rows if r["site"] == line)
    assert any("random.py" in frame for frame in row["traceback"])  # the path still shows where
