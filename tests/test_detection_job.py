"""The detection job's own parts on a real store: events say a finding's summary once, and the suspects
and attribution are refreshed on every memory judgement of an open leak, not only when it opens."""

from __future__ import annotations

from dataclasses import replace

from agent.core.histograms import HistogramRow, Snapshot
from agent.core.records import Sample
from agent.detect import DetectParams, Finding, Transition
from agent.detect.latency_rules import SlowParams
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
