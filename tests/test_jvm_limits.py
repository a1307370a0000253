"""A JVM's own ceilings read from real JVMs: `jcmd VM.flags` when it answers, the command line when the JVM
refuses attach (never attached: no SIGQUIT, no thread dump), nothing when neither says; and the heap's
resident pages that tell the JVM's memory outside its heap from the heap it sizes itself. The agent
says what it read (`memory_ceilings`), and with no heap ceiling falls back to the memory limit and
says so, and keeps running."""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest

from agent.core.records import ProbeTarget
from probes.jvm import JvmProbe
from probes.jvmlimits import JvmLimitsProbe
from probes.linux.procstatus import read_status
from support.jvm_heap import build_heap_shapes, start_heap_shape
from support.procs import wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("javac") is None or shutil.which("jcmd") is None, reason="needs a JDK"),
]
MiB = 2**20
IDLE = ("expand", 0)  # a JVM serving a few requests in flight
REFUSING = "-XX:+DisableAttachMechanism"


@pytest.fixture(scope="module")
def classes(tmp_path_factory):
    return build_heap_shapes(tmp_path_factory.mktemp("java"))


def _target(pid: int, name: str = "jvm0") -> ProbeTarget:
    return ProbeTarget(
        name, pid, 1000.0, {}, {"histograms": {"jvm": {"interval": 1.0, "heap_interval": 1.0}}}
    )


def test_vm_flags_are_the_jvms_own_account(spawn, classes):
    _proc, pid = start_heap_shape(spawn, classes, *IDLE, "-Xmx96m", "-XX:MaxDirectMemorySize=32m")
    result = JvmLimitsProbe().collect(_target(pid), time.time())
    figures = {s.metric: s.value for s in result.samples}
    assert figures == {
        "jvm_heap_max_bytes": 96 * MiB,
        "jvm_direct_max_bytes": 32 * MiB,
    }  # no metaspace ceiling
    assert result.notes["jvm_limits_source"] == "VM.flags" and result.notes["jvm_limits_problem"] == ""
    assert "MaxHeapSize=100663296" in result.notes["jvm_limits_detail"]


def test_a_jvm_refusing_attach_is_read_from_its_command_line_and_never_signalled(spawn, classes):
    proc, pid = start_heap_shape(
        spawn, classes, *IDLE, REFUSING, "-Xmx64m", JAVA_TOOL_OPTIONS="-XX:MaxMetaspaceSize=48m"
    )
    probe = JvmLimitsProbe()
    result = probe.collect(_target(pid), time.time())
    figures = {s.metric: s.value for s in result.samples}
    assert figures == {
        "jvm_heap_max_bytes": 64 * MiB,
        "jvm_direct_max_bytes": 64 * MiB,
        "jvm_metaspace_max_bytes": 48 * MiB,
    }
    assert result.notes["jvm_limits_source"] == "command line"
    assert "DisableAttachMechanism" in result.notes["jvm_limits_problem"]
    assert probe.collect(_target(pid), time.time() + 7200).notes == result.notes  # refused: not asked again
    os.kill(pid, signal.SIGTERM)
    output = proc.communicate(timeout=30)[0]
    assert "Full thread dump" not in output  # what the attach handshake's SIGQUIT would have printed


def test_a_jvm_that_says_nothing_has_no_ceiling_and_a_process_that_is_no_jvm_gets_nothing(spawn, classes):
    _proc, pid = start_heap_shape(spawn, classes, *IDLE, REFUSING)
    result = JvmLimitsProbe().collect(_target(pid), time.time())
    assert result.samples == [] and result.problems == []
    assert result.notes["jvm_limits_source"] == "unknown"
    not_java = spawn(["sleep", "60"])
    wait_until(lambda: os.path.exists(f"/proc/{not_java.pid}/maps"))
    assert JvmLimitsProbe().collect(_target(not_java.pid), time.time()).notes == {}


def test_the_heaps_resident_pages_split_the_rss(spawn, classes):
    _proc, pid = start_heap_shape(spawn, classes, *IDLE, "-Xmx96m", "-XX:+UseSerialGC")
    result = JvmProbe().collect(_target(pid), time.time())
    assert result.problems == []
    figures = {s.metric: s.value for s in result.samples}
    assert 0 < figures["jvm_heap_resident_bytes"] <= figures["jvm_heap_committed_bytes"] + MiB
    rss = read_status(pid).rss_bytes
    assert abs(figures["jvm_heap_resident_bytes"] + figures["jvm_native_bytes"] - rss) < 0.2 * rss


def test_the_agent_says_which_ceilings_it_read_and_falls_back_on_the_memory_limit(agent, spawn, classes):
    _a, read = start_heap_shape(spawn, classes, *IDLE, "-Xmx96m")
    _b, silent = start_heap_shape(spawn, classes, *IDLE, REFUSING)
    histograms = {"jvm": {"interval": "1h", "heap_interval": "1s"}}
    agent.start(
        {
            "agent": {"interval": "0.5s", "slow_interval": "1s", "flush_interval": "0.3s"},
            "instances": [
                {"name": "read", "match": {"pid": read}, "memory_limit": "1Gi", "histograms": histograms},
                {"name": "silent", "match": {"pid": silent}, "memory_limit": "1Gi", "histograms": histograms},
            ],
        }
    )

    def said(name: str) -> list[dict]:
        return [e for e in agent.events(kind="memory_ceilings") if e["instance"] == name]

    read_event = wait_until(lambda: said("read"), 60, interval=0.5)[0]
    assert read_event["severity"] == "info"
    assert (
        "Java heap 96.0 MiB (MaxHeapSize=100663296, from VM.flags)" in read_event["message"]
        and "the memory limit 1.0 GiB (config)" in read_event["message"]
    )
    silent_event = wait_until(lambda: said("silent"), 60, interval=0.5)[0]
    assert silent_event["severity"] == "warning"
    assert (
        "heap ceiling is unknown" in silent_event["message"]
        and "DisableAttachMechanism" in silent_event["message"]
    )
    assert "projected to the memory limit 1.0 GiB (config)" in silent_event["message"]

    layers = {c["layer"]: c for c in agent.instance("read")["ceilings"]}
    assert layers["container"] == {
        "layer": "container",
        "bytes": 2**30,
        "source": "config",
        "detail": "config",
    }
    assert layers["jvm_heap"]["bytes"] == 96 * MiB and layers["jvm_heap"]["source"] == "VM.flags"
    assert layers["jvm_direct"]["bytes"] == 96 * MiB and "not set" in layers["jvm_direct"]["detail"]
    assert "jvm_metaspace" not in layers
    silent_layers = {c["layer"]: c for c in agent.instance("silent")["ceilings"]}
    assert silent_layers["jvm_heap"]["bytes"] is None and silent_layers["jvm_heap"]["source"] == "unknown"
    assert agent.get("/healthz")  # nothing crashed: the agent still answers
    assert len(said("read")) == 1 and len(said("silent")) == 1  # said once, not at every probe run
    assert not agent.get("/api/v1/findings")["findings"]
