"""Python type histograms through the in-process hook: a real program leaking one type among churning ones,
targets without the hook or with the native shim, and malformed hook replies."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.core.records import ProbeTarget
from probes.pyhist import PythonHistogramProbe, snapshot_from_reply
from support.histo import clean_env, read_ready, write_python
from support.procs import REPO, wait_until
from support.workloads import TargetIO, build_c_target, target_env

FAST = {"interval": "0.5s", "slow_interval": "1s", "flush_interval": "0.3s"}


def _leaker(spawn, tmp_path) -> tuple[int, str]:
    template = f"{tempfile.mkdtemp(prefix='mh-', dir='/tmp')}/py.%p.sock"
    proc = spawn(
        [sys.executable, write_python(tmp_path), str(REPO), template],
        stdout=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    words = read_ready(proc)
    return int(words[1]), template


@pytest.mark.slow
def test_the_leaking_type_is_named_first(agent, spawn, tmp_path):
    """Acceptance: the type a Python program keeps accumulating is the first suspect."""
    pid, template = _leaker(spawn, tmp_path)
    instance = {
        "name": "py0",
        "match": {"pid": pid},
        "hook": {"socket": template},
        "histograms": {"python": {"interval": "1s"}},
    }
    agent.start({"agent": FAST, "instances": [instance]})

    def named() -> list[dict]:
        snapshots = agent.get("/api/v1/instances/py0/histograms", kind="type")["snapshots"]
        if len(snapshots) < 5:
            return []
        suspects = agent.get("/api/v1/instances/py0/suspects", since="5m")["suspects"]
        # the list that holds the records grows too: once both stand out (the list among the ~20
        # containers compared needs a few more snapshots) it is shown as what holds them
        record = next((s for s in suspects if s["name"] == "__main__.LeakyRecord"), None)
        return suspects if record and record["held_by"] else []

    suspects = wait_until(named, timeout=60, interval=0.5)
    assert suspects[0]["name"] == "__main__.LeakyRecord" and suspects[0]["kind"] == "type"
    assert suspects[0]["held_by"][0]["name"] == "__main__.RETAINED", suspects[0]
    assert "__main__.RETAINED" not in [s["name"] for s in suspects]
    assert not any(s["name"].startswith("__main__.Churn") for s in suspects)
    latest = agent.get("/api/v1/instances/py0/histograms", kind="type", top=5)["latest"]["type"]
    assert latest["source"] == "python" and latest["pid"] == pid and len(latest["rows"]) == 5
    assert agent.instance("py0")["latest"]["python_gc_objects"] > 1000


def test_without_a_hook_the_probe_is_quiet(spawn):
    proc = spawn(["sleep", "30"])
    target = ProbeTarget("plain", proc.pid, 1.0, {}, {"histograms": {"python": {"interval": 1.0}}})
    result = PythonHistogramProbe().collect(target, time.time())
    assert result.samples == [] and result.problems == []


@pytest.mark.native
def test_the_native_shim_has_no_type_histogram(spawn, tmp_path):
    template = f"{tempfile.mkdtemp(prefix='mh-', dir='/tmp')}/c.%p.sock"
    proc = spawn(
        [build_c_target(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=target_env("glibc", template, shim=True),
    )
    target_io = TargetIO(proc)
    target = ProbeTarget("native", target_io.pid, 1.0, {}, {"hook": {"socket": template}})
    wait_until(lambda: __import__("os").path.exists(template.replace("%p", str(target_io.pid))))
    result = PythonHistogramProbe().collect(target, time.time())
    assert result.samples == [] and result.problems == []


def test_histogram_intervals_are_per_process(spawn, tmp_path):
    pid, template = _leaker(spawn, tmp_path)
    probe = PythonHistogramProbe()
    target = ProbeTarget(
        "py0", pid, 1.0, {}, {"hook": {"socket": template}, "histograms": {"python": {"interval": 60}}}
    )
    now = time.time()
    first = probe.collect(target, now)
    assert {s.metric for s in first.samples} == {"python_gc_objects", "python_gc_objects_bytes"}
    assert probe.collect(target, now + 30).samples == []
    restarted = ProbeTarget("py0", pid, 2.0, {}, target.settings)  # a new process behind the instance
    assert probe.collect(restarted, now + 30).samples
    probe.forget(target)
    assert probe.collect(target, now + 31).samples


# a hook's JSON may carry integers of any width: 400 digits overflow a float, 2**63 SQLite's INTEGER
wide = st.integers(-(10**400), 10**400) | st.integers(2**63 - 2, 2**63 + 2)
replies = st.fixed_dictionaries(
    {},
    optional={
        "types": st.lists(
            st.one_of(
                st.fixed_dictionaries(
                    {
                        "type": st.text(max_size=20),
                        "count": st.one_of(
                            st.integers(-5, 10**6), wide, st.floats(), st.none(), st.booleans()
                        ),
                        "bytes": st.one_of(st.integers(-5, 10**9), wide, st.floats(), st.text(max_size=3)),
                    }
                ),
                st.integers(),
                st.text(max_size=5),
            ),
            max_size=30,
        ),
        "objects": st.one_of(st.integers(-1, 10**7), wide, st.floats(), st.none(), st.text(max_size=3)),
        "distinct_types": st.one_of(st.integers(0, 10**5), wide, st.none(), st.floats()),
        "elapsed_s": st.floats(),
    },
)


@settings(max_examples=300, deadline=None)
@given(reply=replies)
def test_any_histogram_reply_makes_a_sane_snapshot(reply):
    snapshot = snapshot_from_reply(ProbeTarget("py0", 1, 1.0), 100.0, reply)
    assert all(r.count >= 0 and r.bytes >= 0 for r in snapshot.rows)
    assert len({r.name for r in snapshot.rows}) == len(snapshot.rows)
    assert snapshot.total_count >= 0 and snapshot.total_bytes == sum(r.bytes for r in snapshot.rows)
    assert all(math.isfinite(x) for r in snapshot.rows for x in (r.count, r.bytes))  # no 400-digit int got in
    assert snapshot.kind == "type"
    json.dumps(snapshot.to_dict(), allow_nan=False)  # what the API sends


@pytest.mark.parametrize(
    ("complete", "partial"), [(True, False), (False, True), (None, False), ("no", False)]
)
def test_a_count_the_hook_s_time_budget_cut_short_is_marked_partial(complete, partial):
    reply = {"types": [{"type": "dict", "count": 10, "bytes": 2320}], "contents_complete": complete}
    snapshot = snapshot_from_reply(ProbeTarget("py0", 1, 1.0), 100.0, reply)
    assert snapshot.meta["partial"] is partial
