"""A real agent on the compressed lab config (examples/lab.yaml) against two real JVMs: one leaking native
memory through Deflaters it never closes, one healthy; both make request garbage in a GC sawtooth. One
coherent verdict (a leak outside the Java heap, no "heap the JVM keeps"), the leaking class named first,
and the suspects still on the finding judgements later."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import yaml

from probes.linux.procstatus import read_status
from support.jvm_native import build_native_leak, start_native_leak
from support.procs import PYTHON, REPO, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("javac") is None or shutil.which("jcmd") is None, reason="needs a JDK"),
]
LAB = REPO / "examples" / "lab.yaml"
MiB = 2**20


def lab_config(leaky: int, healthy: int) -> dict:
    """The lab example's agent and detect sections and its JVM histogram settings, for the two JVMs."""
    lab = yaml.safe_load(LAB.read_text())
    jvm = next(i for i in lab["instances"] if "histograms" in i)["histograms"]
    return {
        "agent": {k: v for k, v in lab["agent"].items() if k not in ("listen", "state_dir")},
        "detect": lab["detect"],
        "instances": [
            # the leak (about 2.5 MiB/s) would reach this limit within a minute and a half
            {
                "name": "leaky",
                "match": {"pid": leaky},
                "memory_limit": read_status(leaky).rss_bytes + 220 * MiB,
                "histograms": jvm,
            },
            {"name": "healthy", "match": {"pid": healthy}, "memory_limit": "4Gi", "histograms": jvm},
        ],
    }


def leaks_cli(url: str) -> str:
    done = subprocess.run(
        [PYTHON, "-m", "agent.cli.main", "leaks", "--url", url],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=20,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_jvm_native_leak_is_one_leak_outside_the_heap_with_the_leaking_class_first(agent, spawn, tmp_path):
    classes = build_native_leak(tmp_path)
    leaky = start_native_leak(spawn, classes, leak=True)
    healthy = start_native_leak(spawn, classes, leak=False)
    agent.start(lab_config(leaky, healthy))
    wait_until(lambda: agent.get("/api/v1/findings", kind="leak")["findings"], 200, interval=1.0)

    findings = agent.get("/api/v1/findings")["findings"]
    assert not [f for f in findings if f["instance"] == "healthy"], findings
    assert not [f for f in findings if f["kind"] == "fragmentation"], findings
    leaks = [f for f in findings if f["kind"] == "leak"]
    assert [f["instance"] for f in leaks] == ["leaky"]
    leak = leaks[0]
    assert leak["verdict"] == "leak" and leak["evidence"]["outside_java_heap"]
    attribution = leak["evidence"]["attribution"]
    assert "outside the Java heap" in attribution["verdict"], attribution
    suspects = leak["evidence"]["suspects"]
    assert suspects and suspects[0]["name"] == "java.util.zip.Deflater", suspects
    assert suspects[0]["correlation"] > 0.8
    assert "[F" not in [s["name"] for s in suspects[:1]]

    # the memory above the heap grows from the start: never "heap the JVM keeps", before or after
    kept = [
        e["data"]["finding"]
        for change in ("opened", "updated")
        for e in agent.events(kind=f"finding_{change}")
        if e["data"]["finding"]["instance"] == "leaky"
        and e["data"]["finding"].get("verdict") == "allocator-retention"
    ]
    assert not kept, kept
    opened = [e for e in agent.events(kind="finding_opened") if e["data"]["finding"]["kind"] == "leak"]
    summary = opened[0]["data"]["finding"]["summary"]
    assert opened[0]["message"] == f"leak opened: {summary}"  # said once, not repeated in parentheses
    assert opened[0]["data"]["finding"]["evidence"]["suspects"]  # the finding opens with its suspects

    step = 20.0  # judgements of the lab config (a 2 min window / 24 x 4)
    first = leak["updated_at"]
    wait_until(
        lambda: agent.get("/api/v1/findings", kind="leak")["findings"][0]["updated_at"] >= first + 3 * step,
        120,
        interval=1.0,
    )
    later = agent.get("/api/v1/findings", kind="leak")["findings"][0]
    assert later["id"] == leak["id"]
    assert later["evidence"]["suspects"][0]["name"] == "java.util.zip.Deflater"
    assert "outside the Java heap" in later["evidence"]["attribution"]["verdict"]
    assert not [f for f in agent.get("/api/v1/findings")["findings"] if f["instance"] == "healthy"]

    table = leaks_cli(agent.url)
    assert "ATTRIBUTION" in table.splitlines()[0]
    row = next(line for line in table.splitlines() if line.startswith("leaky") and " leak " in line)
    assert "java.util.zip.Deflater" in row and "outside the Java heap" in row
