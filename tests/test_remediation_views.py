"""Adapters from the agent's real tracker: a pidfile instance is followed across a restart."""

from __future__ import annotations

from conftest import PYTHON

from agent.config import InstanceSpec
from agent.eventlog import EventLog
from agent.store import Store
from agent.tracker import Tracker
from remediation.views import tracker_locator, view_from_state

SLEEPER = [PYTHON, "-c", "import time; time.sleep(600)"]


def test_view_and_locator_follow_the_tracked_process(spawn, tmp_path):
    pidfile = tmp_path / "svc.pid"
    first = spawn(SLEEPER)
    pidfile.write_text(str(first.pid))
    store = Store(tmp_path / "state")
    spec = InstanceSpec.model_validate(
        {"name": "svc", "match": {"pidfile": str(pidfile)}, "labels": {"fleet": "ranker"}}
    )
    tracker = Tracker([spec], store, EventLog(store))
    try:
        tracker.reconcile(scan=True)
        view = view_from_state(tracker.get("svc"))
        assert view.pid == first.pid and view.ready and view.fleet == "ranker" and not view.managed
        assert view.cmdline == tuple(SLEEPER)
        locate = tracker_locator(tracker)
        assert locate("svc").pid == first.pid and locate("nope") is None

        first.kill()
        first.wait()
        assert locate("svc") is None  # gone, not yet replaced
        down = view_from_state(tracker.get("svc"))
        assert down.pid is None and not down.ready

        second = spawn(SLEEPER)
        pidfile.write_text(str(second.pid))
        assert locate("svc").pid == second.pid
    finally:
        store.close()
