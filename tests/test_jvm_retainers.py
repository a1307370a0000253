"""What holds a JVM heap leak: JFR's old-object samples read from `jfr print` (captured outputs and anything
hypothesis makes), turned into holders, and named on the suspects they hold (`held_by`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.histograms import HistogramRow, Snapshot
from agent.core.records import ProbeResult, ProbeTarget
from agent.core.text import held_by_text
from agent.detect.explain.retainers import with_held_by
from agent.detect.explain.suspects import Suspect
from agent.state.histograms import HistogramStore
from agent.state.store import Store
from probes.jfrtext import histogram_name, parse_old_objects, retainer
from probes.jvm import JvmProbe
from probes.jvmretainers import TRIES, Retainers, retainer_rows
from probes.settings import JvmHistograms
from support.jvm_heap import build_heap_shapes, start_heap_shape
from support.procs import wait_until

FIXTURES = Path(__file__).parent / "fixtures" / "jvm"


def test_a_static_map_of_arrays_is_named_with_its_size():
    samples = parse_old_objects((FIXTURES / "old_objects_hashmap_17.txt").read_text())
    assert len(samples) == 12 and {s.type for s in samples} == {"[B"}
    found = retainer(samples[0])
    assert found is not None
    assert found.where == "static field MapLeak.CACHE" and found.what == "java.util.HashMap of 10800 entries"
    assert found.holds == ("[B", "java.util.HashMap$Node", "[Ljava.util.HashMap$Node;")
    assert samples[0].root == "Threads: Stack Variable, Thread Name: main"


def test_records_in_a_map_and_samples_without_a_chain():
    samples = parse_old_objects((FIXTURES / "old_objects_records_17.txt").read_text())
    chained = [s for s in samples if s.chain]
    assert len(samples) == 6 and len(chained) == 4  # the old table and a Long had no path to a root
    rows = retainer_rows(samples)
    assert [(r.name, r.count) for r in rows] == [("static field LeakClasses.RETAINED", 4.0)]
    detail = json.loads(rows[0].detail or "")
    assert detail["what"] == "java.util.HashMap of 56500 entries"
    assert "LeakClasses$LeakyRecord" in detail["holds"] and "[B" in detail["holds"]


def test_array_names_as_a_class_histogram_prints_them():
    assert [
        histogram_name(n) for n in ("byte[1024]", "java.lang.Object[16]", "int[][]", "Foo$Bar", "long[]")
    ] == [
        "[B",
        "[Ljava.lang.Object;",
        "[[I",
        "Foo$Bar",
        "[J",
    ]


def _suspect(name: str, carried: tuple[str, ...] = ()) -> Suspect:
    return Suspect(
        name,
        "class",
        "jvm",
        1000.0,
        1.0,
        0.999,
        0.9,
        "jvm_heap_after_gc_bytes",
        1e6,
        1e3,
        8,
        60.0,
        carried=carried,
    )


def test_suspects_are_held_by_the_holders_whose_chains_pass_through_them(tmp_path):
    store = Store(tmp_path)
    rows = retainer_rows(parse_old_objects((FIXTURES / "old_objects_records_17.txt").read_text()))
    HistogramStore(store).add(Snapshot("jvm0", "jfr", 100.0, rows, 6.0, 0.0, 42, 1.0, len(rows)))
    suspects = [
        _suspect("LeakClasses$LeakyRecord"),
        _suspect("com.acme.Other", carried=("[B",)),  # its payload arrays are the ones held
        _suspect("java.lang.Thread"),
    ]
    held = with_held_by(store, "jvm0", 0.0, 200.0, suspects)
    assert held[0].held_by == (
        {
            "what": "java.util.HashMap of 56500 entries",
            "where": "static field LeakClasses.RETAINED",
            "samples": 4,
        },
    )
    assert held[1].held_by == held[0].held_by and held[2].held_by == ()
    assert held[0].to_dict()["held_by"][0]["where"] == "static field LeakClasses.RETAINED"
    text = held_by_text(held[0].to_dict()["held_by"])
    assert text == "held by static field LeakClasses.RETAINED (java.util.HashMap of 56500 entries)"
    assert with_held_by(store, "other", 0.0, 200.0, suspects) == suspects  # no recording: unchanged
    store.close()


lines = st.one_of(
    st.text(max_size=80).map(lambda s: s.replace("\n", " ")),
    st.sampled_from(
        [
            "jdk.OldObjectSample {",
            "  object =  [",
            "  ]",
            "  root = {",
            "  root = N/A",
            "}",
            "    ...",
            '    description = "Thread Name: main"',
            "    CACHE : java.lang.Class Class Name: X",
            "    table : java.util.HashMap Size: 12",
            "    byte[12]",
            "  object = java.lang.Long",
        ]
    ),
    st.builds(lambda f, t: f"    {f} : {t}", st.text(max_size=20), st.text(max_size=40)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(lines, max_size=60))
def test_any_jfr_text_gives_bounded_samples_and_rows(body):
    samples = parse_old_objects("\n".join(body))
    for sample in samples:
        assert len(sample.chain) <= 64
        found = retainer(sample)
        assert found is None or (found.where and found.holds and found.holds[0] == sample.type)
    for row in retainer_rows(samples):
        assert row.count >= 1 and json.loads(row.detail or "")["holds"]


def test_a_recording_that_failed_is_tried_again_a_few_times_then_given_up(tmp_path):
    """A jcmd that fails (here: configured where there is none; on a loaded host: a timeout) costs one
    try; the next probe run records again, up to TRIES, each failure saying so, then medic stops."""
    retainers = Retainers()
    settings_ = JvmHistograms(jcmd=str(tmp_path / "no-such-jcmd"))
    target = ProbeTarget("jvm0", os.getpid(), 1000.0, {}, {})
    retainers.want("jvm0")
    said = []
    for run in range(TRIES + 2):
        result = ProbeResult()
        retainers.step(target, 2000.0 + run, settings_, result)
        said.extend(str(problem) for problem in result.problems)
    assert len(said) == TRIES, said
    assert all("recording what holds the leak: histograms.jvm.jcmd" in text for text in said), said
    assert f"try 2 of {TRIES}" in said[0] and "try" not in said[-1], said
    retainers.forget(("jvm0", os.getpid(), 1000.0))  # the process went: a new leak finding tries afresh
    retainers.want("jvm0")
    result = ProbeResult()
    retainers.step(target, 3000.0, settings_, result)
    assert len(result.problems) == 1 and f"try 2 of {TRIES}" in str(result.problems[0])


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("javac") is None or shutil.which("jcmd") is None, reason="needs a JDK")
def test_a_real_jvm_names_the_static_map_and_no_recording_stays_behind(spawn, tmp_path):
    classes = build_heap_shapes(tmp_path)
    _proc, pid = start_heap_shape(spawn, classes, "leak", 50, "-Xmx1g")  # sampled among its request garbage
    settings_ = {
        "histograms": {"jvm": {"interval": "1h", "heap_interval": "1s", "retainers": {"record": "3s"}}}
    }
    target = ProbeTarget("jvm0", pid, 1000.0, {}, settings_)
    probe = JvmProbe()

    def recorded() -> HistogramRow | None:
        """Record (again) until the sampler caught some of the leaked arrays while it ran."""
        probe.want_sites("jvm0")  # heard only when no recording runs
        result = probe.collect(target, time.time())
        assert result.problems == []
        found = [s for s in result.snapshots if s.kind == "retainer"]
        rows = [row for s in found for row in s.rows if row.name == "static field HeapShapes.CACHE"]
        return rows[0] if rows else None  # the JDK's own statics may hold a sample or two as well

    row = wait_until(recorded, 150, interval=0.5)
    detail = json.loads(row.detail or "")
    assert detail["what"].startswith("java.util.HashMap of ") and "[B" in detail["holds"], detail
    check = subprocess.run(["jcmd", str(pid), "JFR.check"], capture_output=True, text=True, timeout=60)
    assert "No available recordings" in check.stdout, check.stdout
