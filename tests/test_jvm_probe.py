"""The jvm probe against real JVMs: a leaking program compiled here with javac, a JVM that refuses attach,
and a process that is not a JVM (which jcmd's SIGQUIT would kill)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pytest

from agent.core.errors import ProbeUnavailable
from agent.core.records import ProbeTarget
from probes.jvm import JvmProbe
from support.histo import build_java, clean_env, read_ready
from support.procs import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("javac") is None or shutil.which("jcmd") is None, reason="needs a JDK"),
]
FAST = {"interval": "0.5s", "slow_interval": "1s", "flush_interval": "0.3s"}
LEAKY = "LeakClasses$LeakyRecord"


@pytest.fixture(scope="module")
def classes(tmp_path_factory):
    return build_java(tmp_path_factory.mktemp("java"))


def _jvm(spawn, classes, *flags: str) -> tuple[subprocess.Popen, int]:
    argv = ["java", "-Xmx128m", "-XX:+UseG1GC", *flags, "-cp", str(classes), "LeakClasses", "500"]
    proc = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=clean_env())
    return proc, int(read_ready(proc)[1])


def _target(pid: int, **jvm) -> ProbeTarget:
    settings = {"histograms": {"jvm": {"interval": 1.0, "heap_interval": 1.0, **jvm}}}
    return ProbeTarget("jvm0", pid, 1000.0, {}, settings)


def test_a_process_that_is_not_a_jvm_is_left_alone(spawn):
    """No jcmd, hence no SIGQUIT: `sleep` would die of it."""
    proc = spawn(["sleep", "60"])
    wait_until(lambda: os.path.exists(f"/proc/{proc.pid}/maps"))
    result = JvmProbe().collect(_target(proc.pid), time.time())
    assert result.samples == [] and result.problems == []
    time.sleep(0.2)
    assert proc.poll() is None


def test_a_jvm_refusing_attach_is_unavailable_and_gets_no_signal(spawn, classes):
    proc, pid = _jvm(spawn, classes, "-XX:+DisableAttachMechanism")
    with pytest.raises(ProbeUnavailable, match="DisableAttachMechanism"):
        JvmProbe().collect(_target(pid), time.time())
    os.kill(pid, signal.SIGTERM)
    output = proc.communicate(timeout=30)[0]
    assert "Full thread dump" not in output  # what the attach handshake's SIGQUIT would have printed


def test_heap_nmt_and_histograms_from_one_probe_run(spawn, classes):
    _proc, pid = _jvm(spawn, classes, "-XX:NativeMemoryTracking=summary")
    probe = JvmProbe()
    now = time.time()
    target = _target(pid, live=True, live_floor=60.0)
    result = probe.collect(target, now)
    assert result.problems == []
    metrics = {s.metric: s.value for s in result.samples}
    assert 0 < metrics["jvm_heap_after_gc_bytes"] <= metrics["jvm_heap_used_bytes"]
    assert metrics["jvm_heap_used_bytes"] <= metrics["jvm_heap_committed_bytes"] <= 128 * 2**20
    assert metrics["jvm_nmt_heap_committed_bytes"] == metrics["jvm_heap_committed_bytes"]
    assert metrics["jvm_nmt_committed_bytes"] > metrics["jvm_nmt_heap_committed_bytes"]
    assert metrics["jvm_histogram_bytes"] > 0
    # not due again yet: nothing is run
    assert probe.collect(target, now + 0.5).samples == []
    again = probe.collect(target, now + 1.5)
    assert again.problems == [] and "jvm_histogram_bytes" in {s.metric for s in again.samples}
    snapshots = result.snapshots + again.snapshots
    classes_ = [s for s in snapshots if s.kind == "class"]
    assert [s.meta["variant"] for s in classes_] == ["live", "all"]  # live at most once per live_floor
    nmt = [s for s in snapshots if s.kind == "nmt"]
    assert nmt and "Java Heap" in {r.name for r in nmt[0].rows}


def test_the_leaking_class_is_named_first(agent, spawn, classes):
    """Acceptance: a JVM leaking one class into a static map among churning classes; after a few
    `GC.class_histogram -all` snapshots (garbage included) the suspects name that class first."""
    _proc, pid = _jvm(spawn, classes, "-XX:NativeMemoryTracking=summary")
    jvm = {"interval": "1s", "heap_interval": "1s"}
    agent.start(
        {"agent": FAST, "instances": [{"name": "jvm0", "match": {"pid": pid}, "histograms": {"jvm": jvm}}]}
    )

    def named() -> list[dict]:
        found = agent.get("/api/v1/instances/jvm0/suspects", since="5m")["suspects"]
        return (
            found
            if len(agent.get("/api/v1/instances/jvm0/histograms", kind="class")["snapshots"]) >= 6
            else []
        )

    suspects = wait_until(named, timeout=90, interval=0.5)
    assert suspects[0]["name"] == LEAKY
    assert suspects[0]["kind"] == "class" and suspects[0]["confidence"] >= 0.9
    assert "[B" in suspects[0]["carried"]  # its payload arrays are folded into it
    assert suspects[0]["share_of"] in ("jvm_heap_after_gc_bytes", "jvm_heap_used_bytes", "rss_bytes")

    # its share of the heap's growth (after GC, else used), else of RSS: most of it once the leak
    # outweighs the first seconds' warm-up (the LRU cache filling), which a loaded host stretches
    def most() -> dict | None:
        found = agent.get("/api/v1/instances/jvm0/suspects", since="5m")["suspects"]
        return found[0] if found and found[0]["name"] == LEAKY and (found[0]["share"] or 0) > 0.5 else None

    wait_until(most, timeout=90, interval=1.0)
    assert not any(s["name"].startswith("LeakClasses$Churn") for s in suspects)

    diff = agent.get("/api/v1/instances/jvm0/histograms/diff", kind="class", **{"from": "1h"})
    leaky = next(row for row in diff["rows"] if row["name"] == LEAKY)
    assert leaky["delta_count"] > 0 and diff["same_process"]
    latest = agent.instance("jvm0")["latest"]
    assert latest["jvm_heap_after_gc_bytes"] > 0 and latest["jvm_nmt_committed_bytes"] > 0

    shown = agent.cli("histo", "jvm0", "--since", "5m", timeout=60)
    assert shown.returncode == 0, shown.stderr
    suspects_table = shown.stdout.split("suspects:")[1].splitlines()
    assert LEAKY in suspects_table[2]  # header, then the first suspect
    as_json = json.loads(agent.cli("histo", "jvm0", "--diff", "1h", "--json", timeout=60).stdout)
    assert as_json["kind"] == "class" and as_json["rows"]
