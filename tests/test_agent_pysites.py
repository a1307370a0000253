"""Python allocation sites and probe availability through a real agent, with real hooked targets:

- a Python service filling an unbounded dict of str -> bytes beside one behind a bounded lru_cache:
  the leak's finding names the line that fills the cache first (the agent started tracemalloc in the
  target when the finding opened); the control gets no finding and none of medic's objects shows
  among its top types;
- a Python target (in-process hook) and a native one (jemalloc and the LD_PRELOAD shim): no
  `probe_unavailable` while they start (the grace period), one when the hook really goes away, and
  `probe_recovered` when it answers again; a target stopped by TERM leaves no socket behind.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from support.compressed import DETECT, FAST
from support.histo import build_c, clean_env
from support.procs import PYTHON, REPO, wait_until
from support.workloads import ensure_shim

pytestmark = pytest.mark.slow
SERVICE = Path(__file__).parent / "support" / "pyservice.py"
LIMIT = 320 * 2**20
MEDIC_TYPES = ("medic_hook", "PyCFuncPtrType", "CDLL", "PyDLL", "_FuncPtr", "socket", "selector")
GRACE = 15.0  # agent.watch.collector.PROBE_GRACE


def fill_line() -> str:
    lines = SERVICE.read_text().splitlines()
    number = next(i for i, line in enumerate(lines, 1) if line.strip().endswith("# fills the cache"))
    return f"{SERVICE}:{number}"


def python_instance(name: str, mode: str, sock_dir: str) -> dict:
    template = f"{sock_dir}/{name}.%p.sock"
    return {
        "name": name,
        "match": {
            "command": [PYTHON, str(SERVICE), mode, "--size", "65536", "--every", "0.03"],
            "env": {"PYTHONPATH": str(REPO), "MEDIC_HOOK_SOCKET": template},
        },
        "hook": {"socket": template},
        "memory_limit": LIMIT,
        "histograms": {"python": {"interval": "1s", "sites": {"interval": "1s", "frames": 4}}},
    }


def test_the_leak_s_first_suspect_is_the_line_that_fills_the_cache(agent, sock_dir):
    agent.start(
        {
            "agent": FAST,
            "detect": DETECT,
            "instances": [
                python_instance("leaky", "leak", sock_dir),
                python_instance("cached", "bounded", sock_dir),
            ],
        }
    )

    def named() -> dict | None:
        leaks = agent.get("/api/v1/findings", kind="leak")["findings"]
        suspects = leaks[0]["evidence"].get("suspects") if leaks else None
        return leaks[0] if suspects and suspects[0]["kind"] == "site" else None

    finding = wait_until(named, 150, interval=1.0)
    assert finding["instance"] == "leaky"
    first = finding["evidence"]["suspects"][0]
    assert first["name"] == fill_line(), finding["evidence"]["suspects"]
    assert first["source"] == "tracemalloc" and first["detail"].startswith(fill_line())
    assert first["bytes_per_second"] > 2**20  # ~2 MiB/s of payloads
    started = [e for e in agent.events() if e["kind"] == "finding_opened" and e["instance"] == "leaky"]
    assert started, "the finding opened before tracing started"

    assert not [f for f in agent.get("/api/v1/findings")["findings"] if f["instance"] == "cached"]
    histograms = agent.get("/api/v1/instances/cached/histograms", kind="type", top=200)
    rows = sorted(histograms["latest"]["type"]["rows"], key=lambda r: -r["count"])[:30]
    assert rows and not [r["name"] for r in rows if any(part in r["name"] for part in MEDIC_TYPES)], rows
    assert not agent.get("/api/v1/instances/cached/histograms", kind="site")["snapshots"]  # never traced


@pytest.fixture(scope="module")
def c_binary(tmp_path_factory) -> str:
    return build_c(tmp_path_factory.mktemp("c"))


@pytest.mark.native
def test_no_word_during_start_up_then_unavailable_and_recovered_after_a_real_outage(
    agent, sock_dir, c_binary
):
    native_socket = f"{sock_dir}/native.%p.sock"
    native = {
        "name": "native",
        "match": {
            "command": [c_binary, "4", "200000"],
            "env": {
                **{k: v for k, v in clean_env().items() if k in ("PATH", "HOME")},
                "LD_PRELOAD": f"libjemalloc.so.2:{ensure_shim()}",
                "MEDIC_HOOK_SOCKET": native_socket,
            },
        },
        "hook": {"socket": native_socket},
    }
    agent.start({"agent": FAST, "instances": [python_instance("py", "idle", sock_dir), native]})
    names = ("py", "native")

    def answering() -> bool:
        return all(agent.instance(n)["probes"].get("allocator", {}).get("last_success") for n in names)

    wait_until(answering, 30, interval=0.2)
    assert not [e for e in agent.events() if e["kind"] == "probe_unavailable"]  # the start-up race

    started = {n: agent.instance(n)["start_time"] for n in names}
    time.sleep(max(0.0, max(started.values()) + GRACE + 1 - time.time()))
    pids = {n: agent.instance(n)["pid"] for n in names}
    paths = {
        "py": f"{sock_dir}/py.{pids['py']}.sock",
        "native": native_socket.replace("%p", str(pids["native"])),
    }

    os.kill(pids["py"], signal.SIGUSR1)  # the Python hook stops: its socket goes away
    os.rename(paths["native"], paths["native"] + ".away")  # the shim's socket is not where medic looks

    def allocator_events(kind: str, **data: str) -> list[dict]:
        return [
            e
            for e in agent.events()
            if e["kind"] == kind
            and e["data"].get("probe") == "allocator"
            and all(e["data"].get(k) == v for k, v in data.items())
        ]

    def events_of(kind: str, **data: str) -> set[str]:
        return {e["instance"] for e in allocator_events(kind, **data)}

    wait_until(lambda: events_of("probe_unavailable") >= set(names), 20, interval=0.2)
    time.sleep(1.0)
    os.kill(pids["py"], signal.SIGUSR1)  # ... and starts again
    os.rename(paths["native"] + ".away", paths["native"])
    # a busy host may also time a probe out once (a separate `after: error` recovery): not this one
    wait_until(lambda: events_of("probe_recovered", after="unavailable") >= set(names), 20, interval=0.2)
    recovered = allocator_events("probe_recovered", after="unavailable")
    assert all(e["data"]["unavailable_for"] >= 1.0 for e in recovered)
    assert "has data again" in recovered[0]["message"]

    os.kill(pids["py"], signal.SIGTERM)  # no exit handler runs: the hook cannot remove its socket
    wait_until(lambda: agent.instance("py")["pid"] not in (None, pids["py"]), 30, interval=0.2)
    wait_until(lambda: not os.path.exists(paths["py"]), 10, interval=0.2)  # medic removed it


def test_medic_heap_sites_starts_tracing_on_demand(agent, sock_dir):
    agent.start({"agent": FAST, "instances": [python_instance("svc", "leak", sock_dir)]})
    wait_until(lambda: agent.instance("svc")["pid"], 30, interval=0.2)
    assert agent.cli("heap", "svc", "--sites", "0s").returncode == 2  # out of range: a usage error
    started = agent.cli("heap", "svc", "--sites", "2m", "--sites-frames", "3")
    assert started.returncode == 0, started.stderr
    assert "tracing allocation sites with 3 frames" in started.stdout

    def suspects() -> list[dict]:
        return agent.get("/api/v1/instances/svc/suspects", since="5m", kind="site")["suspects"]

    found = wait_until(suspects, 60, interval=0.5)
    assert found[0]["name"] == fill_line() and found[0]["source"] == "tracemalloc"
    shown = agent.cli("heap", "svc", "--since", "5m")
    assert shown.returncode == 0, shown.stderr
    assert "pyservice.py" in shown.stdout

    stopped = agent.cli("heap", "svc", "--stop-sites")
    assert stopped.returncode == 0 and "not tracing allocation sites (stopped on request)" in stopped.stdout
