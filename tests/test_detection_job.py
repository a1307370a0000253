"""The detection job's own parts on a real store: events say a finding's summary once, and the suspects
and attribution are refreshed on every memory judgement of an open leak, not only when it opens."""

from __future__ import annotations

import logging
from dataclasses import replace

from agent.config.model import InstanceSpec
from agent.core.histograms import HistogramRow, Snapshot
from agent.core.records import Sample
from agent.core.timescale import TimeScale
from agent.detect import DetectParams, Finding, Transition
from agent.detect.slow.rules import SlowParams
from agent.jobs.detection import Detection
from agent.state.eventlog import EventLog
from agent.state.histograms import HistogramStore
from agent.state.store import Store
from agent.watch.tracker import Tracker

T0 = 1_800_000_000.0


def job(tmp_path) -> Detection:
    store = Store(tmp_path)
    events = EventLog(store)
    return Detection(Tracker([], store, events), store, events, DetectParams().scaled(180), SlowParams())


def finding(summary: str = "svc leaks 7.2 MiB/h in rss_bytes") -> Finding:
    return Finding(
        "svc:leak:1", "svc", "leak", "error", "open", T0, T0, T0, None, summary, "leak", {}, T0 - 600
    )


def test_an_event_says_the_summary_once(tmp_path):
    detection = job(tmp_path)
    opened = finding()
    detection._record(Transition("opened", opened, T0, opened.summary))
    updated = replace(opened, severity="critical")
    detection._record(
        Transition(
            "updated", updated, T0 + 20, f"severity error -> critical, verdict leak -> leak: {opened.summary}"
        )
    )
    messages = [
        e.message for e in reversed(detection.store.events(kinds=["finding_opened", "finding_updated"]))
    ]
    assert messages == [
        f"leak opened: {opened.summary}",
        f"leak updated: {opened.summary} (severity error -> critical, verdict leak -> leak)",
    ]


def test_a_finding_is_a_warning_in_the_agent_log_and_the_agent_s_own_failures_are_errors(tmp_path, caplog):
    """The severity ranks a finding for people; the log level says how the agent fares."""
    detection = job(tmp_path)
    opened = replace(finding(), severity="critical")
    with caplog.at_level(logging.DEBUG, logger="medic.events"):
        detection._record(Transition("opened", opened, T0, opened.summary))
        detection._record(Transition("resolved", opened, T0 + 60, "no longer grows"))
        detection.events.emit("remediation_escalated", "needs a person", instance="svc", severity="critical")
        detection.events.emit("reconcile_error", "cannot update: boom", instance="svc", severity="error")
    levels = {r.getMessage().split(":")[0].removeprefix("[svc] "): r.levelname for r in caplog.records}
    assert levels == {
        "finding_opened": "WARNING",
        "finding_resolved": "INFO",
        "remediation_escalated": "WARNING",
        "reconcile_error": "ERROR",
    }
    stored = detection.store.events(kinds=["finding_opened"])
    assert stored[0].severity == "critical", "the event keeps its severity for alerts"


def test_an_open_leak_gets_fresh_suspects_at_each_judgement(tmp_path):
    detection = job(tmp_path)
    store = detection.store
    histos = HistogramStore(store)
    store.add_samples(Sample("svc", "rss_bytes", T0 - 600 + k * 5, 1e8 + 5e4 * k * 5) for k in range(120))
    store.flush()
    for i in range(8):
        n = 100 + 50 * i
        histos.add(
            Snapshot(
                "svc",
                "jvm",
                T0 - 400 + 30 * i,
                [HistogramRow("com.app.Leak", n, 48 * n)],
                n,
                48 * n,
                1,
                1.0,
                1,
            )
        )
    active = finding()
    detection.active = [active]
    detection._explain([], T0)
    assert active.evidence["suspects"][0]["name"] == "com.app.Leak"
    first_count = active.evidence["suspects"][0]["count"]
    for i in range(8, 12):
        n = 100 + 50 * i
        histos.add(
            Snapshot(
                "svc",
                "jvm",
                T0 - 400 + 30 * i,
                [HistogramRow("com.app.Leak", n, 48 * n)],
                n,
                48 * n,
                1,
                1.0,
                1,
            )
        )
    detection._explain([], T0 + 120)  # a judgement with no transition
    assert active.evidence["suspects"][0]["count"] > first_count
    assert "attribution" in active.evidence


def test_the_slo_window_is_compressed_with_the_agent_time_scale(tmp_path):
    """`latency.slo.for: 5m` at `agent.time_scale: 60` is 5 s, as every other detection window (held
    at 10 probe intervals of 0.25 s: 2.5 s, below it): 20 s of a p99 three times its SLO opens a slow
    finding by its SLO rule. Unscaled, the same 20 s cover too little of a 5-minute window to judge it."""
    spec = InstanceSpec.model_validate(
        {"name": "svc", "match": {"pid": 1}, "latency": {"slo": {"threshold": "100ms", "for": "5m"}}}
    )
    slow = SlowParams().scaled(TimeScale(60, 0.25))
    found = {}
    for scale in (60.0, 1.0):
        store = Store(tmp_path / f"scale-{scale:g}")
        events = EventLog(store)
        store.add_samples(Sample("svc", "latency_p99_seconds", T0 + k * 0.25, 0.3) for k in range(80))
        store.flush()
        detection = Detection(
            Tracker([spec], store, events), store, events, DetectParams(), slow, scale=TimeScale(scale, 0.25)
        )
        for k in range(6):
            detection.run(T0 + 10 + k * slow.step)
        found[scale] = [f for f in detection.active if f.kind == "slow"]
    [opened] = found[60.0]
    assert opened.evidence["fired"] == ["slo"], opened.summary
    assert opened.evidence["rules"]["slo"]["window_seconds"] == 5.0
    assert found[1.0] == []


def test_an_slo_window_longer_than_the_other_windows_is_read_whole(tmp_path):
    """`for: 1h` is longer than the slow detector's own windows (30 min at most): the job reads the
    hour, so an hour over the SLO is judged, not left unknown for want of data."""
    spec = InstanceSpec.model_validate(
        {"name": "svc", "match": {"pid": 1}, "latency": {"slo": {"threshold": "100ms", "for": "1h"}}}
    )
    store = Store(tmp_path)
    events = EventLog(store)
    store.add_samples(Sample("svc", "latency_p99_seconds", T0 + k * 10.0, 0.3) for k in range(400))
    store.flush()
    slow = SlowParams()
    detection = Detection(Tracker([spec], store, events), store, events, DetectParams(), slow)
    for k in range(3):
        detection.run(T0 + 3900 + k * slow.step)
    [opened] = [f for f in detection.active if f.kind == "slow"]
    assert opened.evidence["fired"] == ["slo"] and opened.evidence["rules"]["slo"]["window_seconds"] == 3600
