"""Native heap profiles end to end: a C program leaking from one of several allocating functions, under
jemalloc (dumps through the shim, or the allocator's own interval dumps) and under gperftools' heap
profiler (HEAPPROFILE files, or started through the shim): the heap diff names that function first."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from agent.core.errors import ProbeUnavailable
from agent.core.records import ProbeTarget
from agent.detect.explain.ranking import suspects_for
from agent.state.histograms import HistogramStore
from agent.state.store import Store
from probes.heapprof import HeapProfileProbe
from support.agent_runner import medic_cli
from support.histo import build_c, clean_env, read_ready
from support.procs import wait_until
from support.workloads import ensure_shim

pytestmark = [pytest.mark.native, pytest.mark.slow]
FAST = {"interval": "0.5s", "slow_interval": "1s", "flush_interval": "0.3s"}


@pytest.fixture(scope="module")
def binary(tmp_path_factory) -> str:
    return build_c(tmp_path_factory.mktemp("c"))


def _start(spawn, binary: str, env: dict[str, str]) -> int:
    proc = spawn(
        [binary, "256", "100000"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    return int(read_ready(proc)[1])


def _socket() -> str:
    return f"{tempfile.mkdtemp(prefix='mh-', dir='/tmp')}/hook.%p.sock"


def _heap_diff_names_the_leak(agent, name: str) -> dict:
    def named() -> list[dict]:
        snapshots = agent.get(f"/api/v1/instances/{name}/histograms", kind="site")["snapshots"]
        found = agent.get(f"/api/v1/instances/{name}/suspects", since="5m", kind="site")["suspects"]
        return found if len(snapshots) >= 5 else []

    suspects = wait_until(named, timeout=60, interval=0.5)
    assert suspects[0]["name"] == "leak_records" and suspects[0]["share"] > 0.5  # sampled: an estimate
    diff = agent.get(f"/api/v1/instances/{name}/heap/diff", **{"from": "1h"})
    assert diff["rows"][0]["name"] == "leak_records"
    assert diff["rows"][0]["delta_bytes"] > 4 * 2**20  # 256 x 4 KiB per 100 ms, over several seconds
    assert diff["rows"][0]["detail"].startswith("leak_records ← main")
    return diff


def test_jemalloc_dumps_through_the_shim(agent, spawn, binary, tmp_path):
    """Acceptance (jemalloc): MALLOC_CONF=prof:true,prof_active:false; medic turns sampling on, dumps."""
    template = _socket()
    env = clean_env(
        LD_PRELOAD=f"libjemalloc.so.2:{ensure_shim()}",
        MEDIC_HOOK_SOCKET=template,
        MALLOC_CONF="prof:true,prof_active:false,lg_prof_sample:16",
    )
    pid = _start(spawn, binary, env)
    dumps = tmp_path / "dumps"
    instance = {
        "name": "c0",
        "match": {"pid": pid},
        "hook": {"socket": template},
        "histograms": {"heap_profiles": {"dir": str(dumps), "interval": "1s", "keep": 3}},
    }
    agent.start({"agent": FAST, "instances": [instance]})
    diff = _heap_diff_names_the_leak(agent, "c0")
    assert diff["after"]["source"] == "jemalloc" and diff["after"]["meta"]["sample_period"] == 65536
    assert len(list(dumps.glob("medic.c0.*.heap"))) <= 3  # medic keeps only its last `keep` dumps

    shown = agent.cli("heap", "c0", "--since", "5m", timeout=60)
    assert shown.returncode == 0, shown.stderr
    table = shown.stdout.splitlines()
    assert "leak_records" in table[2]  # title, header, then the top site
    assert "memory layers of c0" in shown.stdout and "allocator_live" in shown.stdout


def test_gperftools_heapprofile_files(agent, spawn, binary, tmp_path):
    """Acceptance (gperftools): HEAPPROFILE dumps that libtcmalloc.so.4 writes itself, read from the dir."""
    dumps = tmp_path / "tc"
    dumps.mkdir()
    env = clean_env(
        LD_PRELOAD="libtcmalloc.so.4",
        HEAPPROFILE=f"{dumps}/hp",
        HEAP_PROFILE_ALLOCATION_INTERVAL=str(16 << 20),
    )
    pid = _start(spawn, binary, env)
    instance = {
        "name": "tc0",
        "match": {"pid": pid},
        "histograms": {"heap_profiles": {"dir": str(dumps), "interval": "1s"}},
    }
    agent.start({"agent": FAST, "instances": [instance]})
    diff = _heap_diff_names_the_leak(agent, "tc0")
    assert diff["after"]["source"] == "gperftools" and diff["after"]["meta"]["sample_period"] == 0


@pytest.mark.parametrize("mode", ["jemalloc-files", "tcmalloc-shim"])
def test_the_other_two_ways_to_get_dumps(spawn, binary, tmp_path, mode):
    dumps = tmp_path / "dumps"
    dumps.mkdir()
    template = _socket()
    if mode == "jemalloc-files":
        conf = f"prof:true,lg_prof_sample:16,lg_prof_interval:24,prof_prefix:{dumps}/jeprof"
        env = clean_env(LD_PRELOAD="libjemalloc.so.2", MALLOC_CONF=conf)
    else:  # the shim starts tcmalloc's profiler with a prefix, then dumps
        env = clean_env(LD_PRELOAD=f"libtcmalloc.so.4:{ensure_shim()}", MEDIC_HOOK_SOCKET=template)
    pid = _start(spawn, binary, env)
    settings = {
        "hook": {"socket": template},
        "histograms": {"heap_profiles": {"dir": str(dumps), "interval": 1.0}},
    }
    target = ProbeTarget("c1", pid, time.time() - 1.0, {}, settings)
    store = Store(tmp_path / "state")
    histos = HistogramStore(store)
    try:
        probe = HeapProfileProbe()
        for _ in range(8):  # the first dump or two may predate the profiler (tcmalloc) or the leak's growth
            time.sleep(1.0)
            result = probe.collect(target, time.time())
            assert result.problems == []
            for snapshot in result.snapshots:  # what the collector does with them
                histos.add(snapshot)
        suspects = suspects_for(store, "c1", time.time() - 60, time.time() + 1)
        history = histos.history("c1", "site", 0, time.time() + 1)
        seen = [(round(s.ts, 2), [(r.name, round(r.bytes)) for r in s.rows[:3]]) for s in history]
        assert suspects and suspects[0].name == "leak_records" and suspects[0].kind == "site", seen
    finally:
        store.close()


def test_heap_profiles_are_opt_in_and_say_how_to_get_dumps(spawn, tmp_path):
    proc = spawn(["sleep", "30"])
    probe = HeapProfileProbe()
    assert probe.collect(ProbeTarget("plain", proc.pid, 1.0), time.time()).samples == []
    wanting = ProbeTarget(
        "plain", proc.pid, 1.0, {}, {"histograms": {"heap_profiles": {"dir": str(tmp_path)}}}
    )
    with pytest.raises(ProbeUnavailable, match="HEAPPROFILE=DIR/hp"):
        probe.collect(wanting, time.time())


def test_offline_heap_diff_of_two_files(binary, tmp_path):
    """`medic heap --file NEW --base-file OLD` works without an agent, like `jeprof --base`."""
    dumps = tmp_path / "je"
    dumps.mkdir()
    conf = f"prof:true,prof_final:true,lg_prof_sample:14,lg_prof_interval:23,prof_prefix:{dumps}/jeprof"
    subprocess.run(
        [binary, "256", "1000", "20"],
        env=clean_env(LD_PRELOAD="libjemalloc.so.2", MALLOC_CONF=conf),
        check=True,
        capture_output=True,
        timeout=60,
    )
    final = next(dumps.glob("*.f.heap"))
    first = min(dumps.glob("*.i*.heap"), key=lambda p: int(Path(p).name.split(".")[2]))
    shown = medic_cli("heap", "--file", str(final), "--base-file", str(first), "--frames", "2", timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "leak_records via main" in shown.stdout.splitlines()[2]
    broken = tmp_path / "broken.heap"
    broken.write_bytes(final.read_bytes()[:200])
    failed = medic_cli("heap", "--file", str(broken), timeout=60)
    assert failed.returncode == 2 and "truncated" in failed.stderr and str(broken) in failed.stderr
    missing = medic_cli("heap", "--file", str(tmp_path / "missing.heap"), timeout=60)
    assert missing.returncode == 2 and "missing.heap" in missing.stderr
