"""A collector over one instance ("svc", this test process, started at t=100) for probe-health tests."""

from __future__ import annotations

import os

from agent.config.loader import validate_config
from agent.state.eventlog import EventLog
from agent.state.histograms import HistogramStore
from agent.state.store import Store
from agent.watch.collector import Collector
from agent.watch.tracker import Tracker
from probes.base import Probe

START_TIME = 100.0


def one_instance_collector(
    store: Store,
    probes: list[Probe],
    histograms: HistogramStore | None = None,
    grace: float = 0.0,
    pid: int | None = None,
) -> Collector:
    """`pid`: the process the instance follows (default: this test process)."""
    pid = os.getpid() if pid is None else pid
    config = validate_config({"instances": [{"name": "svc", "match": {"pid": pid}}]})
    events = EventLog(store)
    tracker = Tracker(config.instances, store, events)
    state = tracker.states["svc"]
    state.status, state.pid, state.start_time = "up", pid, START_TIME
    return Collector(tracker, store, events, probes, histograms=histograms, grace=grace)
