"""Probe health through the collector: a probe without data, one that fails, and the two recoveries,
each said once and told apart by `after`."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agent.core.errors import ProbeError, ProbeUnavailable
from agent.core.records import ProbeResult, ProbeTarget, Sample
from agent.state.store import Store
from support.collector import START_TIME, one_instance_collector
from support.procs import wait_until


class ScriptedProbe:
    """Answers each run with the next outcome of its script: "none" (no data), "fail" or "ok"."""

    name = "allocator"
    schedule = "fast"

    def __init__(self, script: list[str]) -> None:
        self.script = list(script)

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        outcome = self.script.pop(0)
        if outcome == "none":
            raise ProbeUnavailable("no hook socket")
        if outcome == "fail":
            raise ProbeError("hook did not answer within 1.0s")
        return ProbeResult([Sample(target.instance, "allocated_bytes", now, 1.0)])

    def forget(self, target: ProbeTarget) -> None:
        pass


def _events(store: Store) -> list[tuple[str, dict]]:
    return [(e.kind, e.data) for e in store.events(instance="svc", after_id=0) if e.kind.startswith("probe_")]


def test_an_outage_with_a_timeout_inside_recovers_from_each_once(tmp_path):
    store = Store(tmp_path)
    collector = one_instance_collector(store, [ScriptedProbe(["none", "none", "fail", "ok", "ok"])])
    for step in range(5):  # 31 s apart: past any retry back-off
        collector.run("fast", now=START_TIME + 60 + 31 * step)
    kinds = [kind for kind, _ in _events(store)]
    assert kinds == ["probe_unavailable", "probe_error", "probe_recovered", "probe_recovered"]
    recovered = {data["after"]: data for kind, data in _events(store) if kind == "probe_recovered"}
    assert set(recovered) == {"unavailable", "error"}
    assert recovered["unavailable"]["unavailable_for"] == 93.0  # first miss to the answer
    health = collector.tracker.states["svc"].probes["allocator"]
    assert health.ok and health.unavailable is None and health.errors_total == 1


def test_a_probe_without_data_during_start_up_says_nothing(tmp_path):
    store = Store(tmp_path)
    collector = one_instance_collector(store, [ScriptedProbe(["none", "ok"])], grace=15.0)
    collector.run("fast", now=START_TIME + 5)
    collector.run("fast", now=START_TIME + 6)
    assert _events(store) == []


class DyingProbe(ScriptedProbe):
    """The process exits while the probe asks it (killed, left a zombie): then the outcome of its script."""

    def __init__(self, script: list[str], process: subprocess.Popen | None) -> None:
        super().__init__(script)
        self.process = process

    def collect(self, target: ProbeTarget, now: float) -> ProbeResult:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            wait_until(
                lambda: Path(f"/proc/{target.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            )
        if self.script[0] == "partial":
            self.script.pop(0)
            return ProbeResult(
                [Sample(target.instance, "allocated_bytes", now, 1.0)],
                problems=[ProbeError("no hook socket at /run/medic/hook.1.sock")],
            )
        return super().collect(target, now)


@pytest.mark.parametrize("dies", [True, False], ids=["exits meanwhile", "lives"])
def test_a_probe_that_fails_because_its_process_exited_says_nothing_and_a_live_one_s_failures_are_said(
    tmp_path, spawn, dies
):
    """A target exiting under a probe takes its hook socket with it: 'no hook socket' then is its exit
    (which the tracker reports), not a probe without data; the same failures of a live process are said."""
    child = spawn(["sleep", "600"])
    store = Store(tmp_path)
    probe = DyingProbe(["none", "fail", "partial"], child if dies else None)
    collector = one_instance_collector(store, [probe], pid=child.pid)
    for step in range(3):
        collector.run("fast", now=START_TIME + 60 + 31 * step)
    health = collector.tracker.states["svc"].probes["allocator"]
    if dies:
        assert _events(store) == [] and health.unavailable is None and health.errors_total == 0
    else:
        kinds = [kind for kind, _ in _events(store)]
        assert kinds == ["probe_unavailable", "probe_error", "probe_recovered", "probe_error"], kinds
        assert health.errors_total == 2
