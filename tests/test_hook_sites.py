"""Python allocation sites and the hook's hygiene in a real host program (tests/support/pyservice.py):
tracemalloc started on request, the filling line named first, the session stopped by its budgets with
nothing left behind; the contents of an untracked str -> bytes cache counted; and a host whose GC
objects and types do not grow over 1,000 requests, with none of medic's own among its top types."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.errors import ProbeError
from agent.core.records import ProbeTarget
from native_hooks.client import HookClient
from native_hooks.errors import HookOpUnavailable, HookRequestError
from probes import pyhist
from probes.pyhist import PythonHistogramProbe, sites_snapshot_from_reply
from probes.settings import PythonHistograms, settings_for
from support.histo import clean_env
from support.procs import PYTHON, REPO, wait_ready, wait_until

SERVICE = Path(__file__).parent / "support" / "pyservice.py"
MEDIC_TYPES = ("medic_hook", "PyCFuncPtrType", "CDLL", "PyDLL", "_FuncPtr", "socket", "selector")


def fill_line() -> str:
    """`file:line` of the line that fills the service's cache."""
    lines = SERVICE.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if line.strip().endswith("# fills the cache"))
    return f"{SERVICE}:{number}"


class Host:
    """A pyservice process driven through stdin, and a client of its hook."""

    def __init__(self, spawn, sock_dir: str, mode: str, size: int = 64 * 1024, preload: str = "") -> None:
        env = clean_env(PYTHONPATH=str(REPO), MEDIC_HOOK_SOCKET=f"{sock_dir}/h.%p.sock")
        if preload:
            env["LD_PRELOAD"] = preload
        self.proc = spawn(
            [PYTHON, str(SERVICE), mode, "--size", str(size)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.pid = int(wait_ready(self.proc, 30)[1])
        self.path = f"{sock_dir}/h.{self.pid}.sock"
        self.hook = HookClient(self.path, 10.0, pid=self.pid)

    def command(self, line: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline()

    def counts(self) -> dict:
        return json.loads(self.command("count"))


@pytest.fixture
def host(spawn, sock_dir):
    """`host(mode, size=...)` starts a pyservice; its hook clients are closed at teardown."""
    started: list[Host] = []

    def start(mode: str, size: int = 64 * 1024, preload: str = "") -> Host:
        started.append(Host(spawn, sock_dir, mode, size, preload))
        return started[-1]

    yield start
    for one in started:
        one.hook.close()


def test_sites_name_the_line_that_fills_the_cache_and_the_session_stops_clean(host):
    host = host("leak")
    with pytest.raises(HookOpUnavailable, match="send sites_start first"):
        host.hook.request("sites")
    started = host.hook.request("sites_start", frames=3, duration_s=60)
    assert started["tracing"] and started["owned"] and started["frames"] == 3
    assert host.counts()["tracing"]
    sizes = []
    for _ in range(3):
        host.command("fill 50")
        reply = host.hook.request("sites", top=5)
        sizes.append(reply["sites"][0]["bytes"])
        top = reply["sites"][0]
        assert top["site"] == fill_line(), reply["sites"]
        assert top["traceback"][0] == fill_line() and "pyservice.py" in top["traceback"][1]
        assert not [s for s in reply["sites"] if "medic_hook" in " ".join(s["traceback"])]
    assert sizes[0] >= 50 * 64 * 1024 and sizes[0] < sizes[1] < sizes[2]  # growth since the start

    stopped = host.hook.request("sites_stop")
    assert stopped["tracing"] is False and stopped["stopped_reason"] == "stopped on request"
    assert host.counts()["tracing"] is False  # tracemalloc itself is stopped: its memory is freed


def test_one_frame_asked_still_tells_the_hook_s_own_allocations_apart(host):
    """Tracing records at least four frames (the hook's replies are encoded three frames deep in json),
    and a traceback shows the one asked for."""
    host = host("leak")
    started = host.hook.request("sites_start", frames=1, duration_s=60)
    assert started["frames"] == 1
    for _ in range(3):
        host.command("fill 20")
        host.hook.request("histogram", top=200)  # a large reply, encoded by the hook while tracing
        reply = host.hook.request("sites", top=20)
        assert reply["sites"][0]["site"] == fill_line()
        assert all(len(site["traceback"]) == 1 for site in reply["sites"])
        assert not [s for s in reply["sites"] if "json" in s["site"]], reply["sites"]
    host.hook.request("sites_stop")


def test_the_session_stops_itself_when_a_budget_runs_out(host):
    host = host("leak", size=64)
    host.hook.request("sites_start", duration_s=1)
    wait_until(lambda: not host.counts()["tracing"], 10)  # no request needed: the hook's loop stops it
    with pytest.raises(HookOpUnavailable, match="time budget"):
        host.hook.request("sites")

    host.hook.request("sites_start", duration_s=600, max_memory=2**20)
    host.command("fill 30000")  # 60,000 traced allocations: about 3 MiB of tracemalloc's tables
    wait_until(lambda: not host.counts()["tracing"], 10)
    with pytest.raises(HookOpUnavailable, match="memory budget"):
        host.hook.request("sites")


def test_the_probe_says_when_a_session_starts_and_which_setting_ended_it(host, sock_dir):
    host = host("leak", size=64)
    settings = {"python": {"interval": 3600, "sites": {"interval": 0.5, "max_memory": "1Mi", "frames": 3}}}
    target = ProbeTarget(
        "svc", host.pid, 1.0, {}, {"hook": {"socket": f"{sock_dir}/h.%p.sock"}, "histograms": settings}
    )
    probe = PythonHistogramProbe()
    probe.want_sites("svc")
    first = probe.collect(target, 1000.0)
    assert [e.kind for e in first.events] == ["sites_started"], first.events
    assert "3 frames" in first.events[0].message and "1.0 MiB" in first.events[0].message
    assert [s.source for s in first.snapshots] == ["tracemalloc", "python", "containers"]
    host.command("fill 30000")  # 60,000 traced allocations: about 3 MiB of tracemalloc's tables
    wait_until(lambda: not host.counts()["tracing"], 10)
    ended = probe.collect(target, 1001.0)
    assert [e.kind for e in ended.events] == ["sites_stopped"], ended.events
    event = ended.events[0]
    assert event.severity == "warning" and event.data["snapshots"] == 1, event
    assert (
        event.data["setting"] == "histograms.python.sites.max_memory"
        and "memory budget" in event.data["reason"]
    )
    assert "raise histograms.python.sites.max_memory (now 1.0 MiB)" in event.message
    assert not probe.collect(target, 1002.0).events  # said once


def test_an_older_hook_s_refusal_names_the_setting_medic_has():
    old = "heap too large to walk: about 2400000 objects > max_objects 2000000; raise max_objects"
    said = pyhist._with_setting(old, 1.0)
    assert (
        said.startswith(old) and "histograms.python.budget, now 1.0s" in said and "update medic_hook" in said
    )
    new = (
        "histogram walk exceeded its budget ...; raise budget_s (histograms.python.budget in medic's config)"
    )
    assert pyhist._with_setting(new, 1.0) == new


@pytest.mark.parametrize(
    "params",
    [{"frames": 0}, {"frames": 26}, {"duration_s": 0}, {"max_memory": 1}, {"frames": "5"}, {"frames": True}],
)
def test_sites_start_parameters_are_validated(host, params):
    host = host("idle")
    with pytest.raises(HookRequestError) as refused:
        host.hook.request("sites_start", **params)
    assert refused.value.code == "bad_request"
    assert host.counts()["tracing"] is False


def test_a_cache_of_str_to_bytes_shows_at_its_real_size(host):
    """An unbounded dict of str -> bytes is not tracked by the GC, nor are its items: the largest
    dicts' contents are counted, so the cache's bytes show (64 MiB here), not a dict of a few KiB."""
    host = host("leak", size=64 * 1024)
    host.command("fill 1024")
    reply = host.hook.request("histogram", top=20)
    types = {row["type"]: row for row in reply["types"]}
    assert types["bytes"]["bytes"] >= 64 * 2**20 and types["bytes"]["count"] >= 1024
    cache = reply["containers"][0]
    assert cache["len"] == 1024 and cache["holds"] == "str -> bytes" and cache["complete"]
    assert cache["content_bytes"] >= 64 * 2**20


@pytest.mark.parametrize(
    "preload",
    [
        "",
        pytest.param("libjemalloc.so.2", marks=pytest.mark.native),
        pytest.param("libtcmalloc.so.4", marks=pytest.mark.native),
    ],
)
def test_the_host_does_not_grow_over_a_thousand_requests(host, preload):
    """Each request allocates only its reply: ctypes handles are opened once (a CDLL per request
    left a new function-pointer type behind each time), and nothing else accumulates in the host,
    under each allocator."""
    host = host("idle", preload=preload)
    cycle = [("stats", {}), ("ping", {}), ("stats", {"detail": True}), ("histogram", {"top": 5})]
    for op, params in cycle:  # first use imports what each op needs, once (so does counting)
        host.hook.request(op, **params)
    host.counts()
    # with the collector off, garbage in reference cycles (what a ctypes.CDLL per request made: a new
    # class each time) stays in gc.get_objects() instead of waiting unseen for the next collection
    host.command("gc off")
    time.sleep(0.2)  # the hook thread is back in select(), holding nothing of its last request
    before = host.counts()
    for i in range(1000):
        op, params = cycle[i % len(cycle)]
        host.hook.request(op, **params)
    time.sleep(0.2)
    after = host.counts()
    host.command("gc on")
    grown = {
        k: n - before["types"].get(k, 0) for k, n in after["types"].items() if n > before["types"].get(k, 0)
    }
    assert after["objects"] <= before["objects"], grown
    assert not grown

    top = host.hook.request("histogram", top=30)
    assert top["hook_objects"] > 0  # the hook's own objects were found, and left out
    names = [row["type"] for row in top["types"]]
    assert not [name for name in names if any(part in name for part in MEDIC_TYPES)], names


def test_a_forked_child_does_not_inherit_the_session(spawn, sock_dir):
    code = (
        "import os, sys, tracemalloc, medic_hook\n"
        "from medic_hook import sites\n"
        f"medic_hook.start({sock_dir + '/f.%p.sock'!r})\n"
        "sites.start(3, 60, 2**26)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0 if not tracemalloc.is_tracing() and not sites.tracing() else 1)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('ready', os.waitstatus_to_exitcode(status), tracemalloc.is_tracing(), flush=True)\n"
    )
    proc = spawn([PYTHON, "-c", code], stdout=subprocess.PIPE, env=clean_env(PYTHONPATH=str(REPO)))
    assert wait_ready(proc, 30)[1:] == ["0", "True"]


# integers of any width, as JSON carries them (400 digits overflow a float)
WIDE = st.integers(-(10**400), 10**400) | st.integers(2**63 - 2, 2**63 + 2)
sites_replies = st.fixed_dictionaries(
    {
        "sites": st.lists(
            st.one_of(
                st.fixed_dictionaries(
                    {
                        "site": st.one_of(st.text(max_size=30), st.none(), st.integers()),
                        "count": st.one_of(st.integers(-1, 10**6), WIDE, st.floats(), st.none()),
                        "bytes": st.one_of(st.integers(-1, 10**9), WIDE, st.floats(), st.text(max_size=2)),
                        "traceback": st.one_of(
                            st.lists(st.one_of(st.text(max_size=20), st.integers())), st.none()
                        ),
                    }
                ),
                st.integers(),
                st.none(),
            ),
            max_size=8,
        ),
        "total_bytes": st.one_of(st.integers(-5, 10**9), WIDE, st.floats(), st.none()),
        "total_count": st.one_of(st.integers(-5, 10**6), WIDE, st.none()),
        "distinct_sites": st.one_of(st.integers(0, 10**4), WIDE, st.none(), st.floats()),
        "frames": st.one_of(st.integers(1, 25), st.text(max_size=2)),
        "remaining_s": st.floats(),
    }
)


@settings(max_examples=300, deadline=None)
@given(reply=sites_replies)
def test_any_sites_reply_makes_a_sane_snapshot(reply):
    snapshot = sites_snapshot_from_reply(ProbeTarget("py0", 1, 1.0), 100.0, reply)
    assert snapshot.source == "tracemalloc" and snapshot.kind == "site"
    assert all(r.count >= 0 and r.bytes >= 0 and isinstance(r.name, str) for r in snapshot.rows)
    assert snapshot.total_count >= 0 and snapshot.total_bytes >= 0
    json.dumps(snapshot.to_dict(), allow_nan=False)  # what the API sends


def test_sites_snapshot_keeps_the_heaviest_path(host):
    host = host("leak", size=4096)
    host.hook.request("sites_start", frames=4)
    host.command("fill 100")
    snapshot = sites_snapshot_from_reply(
        ProbeTarget("py0", host.pid, time.time()), time.time(), host.hook.request("sites", top=3)
    )
    assert snapshot.rows[0].name == fill_line()
    assert snapshot.rows[0].detail is not None and snapshot.rows[0].detail.startswith(fill_line() + " ← ")


sites_settings = st.dictionaries(
    st.sampled_from(["on_leak", "frames", "duration", "max_memory", "interval", "top", "other"]),
    st.one_of(
        st.integers(-10, 10**10),
        st.booleans(),
        st.none(),
        st.sampled_from(["5s", "1h", "7h", "16Mi", "2Gi", "x"]),
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(raw=sites_settings)
def test_sites_settings_are_bounded_or_refused_in_one_line(raw):
    target = ProbeTarget("py0", 1, 1.0, settings={"histograms": {"python": {"sites": raw}}})
    try:
        sites = settings_for(target, "python", PythonHistograms).sites
    except ProbeError as exc:
        assert str(exc).startswith("invalid histograms.python.sites") and "\n" not in str(exc)
        return
    assert 1 <= sites.frames <= 25 and 1 <= sites.duration <= 6 * 3600
    assert 2**20 <= sites.max_memory <= 2**28 and 0.5 <= sites.interval <= 3600 and 1 <= sites.top <= 500


@settings(max_examples=200, deadline=None)
@given(
    params=st.dictionaries(
        st.sampled_from(["frames", "duration_s", "max_memory", "top", "other"]),
        st.one_of(st.integers(-10, 2**31), st.floats(), st.text(max_size=4), st.booleans(), st.none()),
        max_size=4,
    )
)
def test_the_sites_ops_answer_any_parameters_and_leave_nothing_running(params):
    import tracemalloc

    from medic_hook import handle_line
    from medic_hook.protocol import ERROR_CODES

    for op in ("sites_start", "sites", "sites_stop"):
        reply = handle_line(json.dumps({"op": op, **params}).encode())
        assert reply["ok"] is True or reply["code"] in ERROR_CODES
    assert not tracemalloc.is_tracing()
