"""Adapters from the agent's real tracker: a pidfile instance is followed across a restart, and its
view carries the command line adopted."""

from __future__ import annotations

import subprocess

from agent.config.model import InstanceSpec
from agent.jobs.remediation import tracker_locator, view_from_state
from agent.state.eventlog import EventLog
from agent.state.store import Store
from agent.watch.tracker import Tracker
from probes.linux.procfs import read_cmdline
from remediation.actuators.signals import check_identity
from support.procs import PYTHON, wait_until

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


EXECS = (
    "import os, sys, time; sys.stdin.readline(); "
    "os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', 'now-something-else'])"
)


def test_view_carries_the_command_line_adopted_not_the_one_run_now(spawn, tmp_path):
    """Same pid, same start time, another program (it exec'd): the check before a signal compares
    against what the tracker adopted, so it refuses."""
    proc = spawn([PYTHON, "-c", EXECS], stdin=subprocess.PIPE)
    wait_until(lambda: read_cmdline(proc.pid)[-1:] == [EXECS], 5)
    pidfile = tmp_path / "svc.pid"
    pidfile.write_text(str(proc.pid))
    store = Store(tmp_path / "state")
    tracker = Tracker(
        [InstanceSpec.model_validate({"name": "svc", "match": {"pidfile": str(pidfile)}})],
        store,
        EventLog(store),
    )
    try:
        tracker.reconcile(scan=True)
        assert check_identity(view_from_state(tracker.get("svc"))).ok
        assert proc.stdin is not None
        proc.stdin.write(b"\n")
        proc.stdin.close()
        wait_until(lambda: read_cmdline(proc.pid)[-1:] == ["now-something-else"], 5)
        tracker.reconcile(scan=True)  # same pid and start time: still the followed process
        view = view_from_state(tracker.get("svc"))
        assert view.pid == proc.pid and view.cmdline == (PYTHON, "-c", EXECS)
        decision = check_identity(view)
        assert not decision.ok and decision.code == "cmdline-mismatch", decision
    finally:
        store.close()
