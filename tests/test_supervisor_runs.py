"""The supervisor's own record of every start and exit, its held relaunches, and the managed child's
own bounded log file: real children, no agent."""

from __future__ import annotations

import stat
import time

from agent.watch.supervisor import ManagedProcess
from support.procs import PYTHON, wait_until


def test_every_launch_and_exit_is_recorded_with_its_real_uptime(tmp_path):
    child = ManagedProcess("quick", [PYTHON, "-c", "import sys; sys.exit(7)"], log_path=tmp_path / "q.log")
    child.launch()
    wait_until(lambda: child.poll_exit() is not None, 10)  # exited long before anyone looked
    child.launch()
    wait_until(lambda: child.poll_exit() is not None, 10)
    runs = child.take_runs()
    assert [r.ended_at is None for r in runs] == [True, False, True, False]  # start, end, start, end
    ended = [r for r in runs if r.ended_at is not None]
    assert len(ended) == 2 and {r.exit_status for r in ended} == {7}
    assert all(0 <= r.ended_at - r.started_at < 5 for r in ended)
    assert child.take_runs() == []


def test_a_held_child_is_not_relaunched(tmp_path):
    child = ManagedProcess("held", [PYTHON, "-c", "pass"], log_path=tmp_path / "h.log")
    child.launch()
    wait_until(lambda: child.poll_exit() is not None, 10)
    child.held = "escalated (crash-loop)"
    assert not child.due_for_relaunch(time.time() + 3600)
    child.held = None
    assert child.due_for_relaunch(time.time() + 3600)


def test_the_childs_output_goes_to_its_own_private_bounded_log(tmp_path):
    log = tmp_path / "logs" / "chatty.log"
    code = "import sys, time\nfor i in range(40): print('x' * 1023, flush=True)\ntime.sleep(30)"
    child = ManagedProcess("chatty", [PYTHON, "-c", code], log_path=log)
    child.launch()
    try:
        wait_until(lambda: log.exists() and log.stat().st_size >= 40 * 1024, 10)
        assert stat.S_IMODE(log.stat().st_mode) == 0o600 and stat.S_IMODE(log.parent.stat().st_mode) == 0o700
        child.bound_log(limit=8 * 1024)
        assert log.stat().st_size == 0  # truncated in place; the child keeps appending at the new end
        kept = log.with_name("chatty.log.1")
        assert kept.stat().st_size == 8 * 1024 and stat.S_IMODE(kept.stat().st_mode) == 0o600
    finally:
        child.stop(2.0)


def test_a_restart_is_never_due_for_a_relaunch_by_the_tracker_until_its_new_process_runs(tmp_path):
    """The tracker runs beside a remediation's restart: at every moment of it (the stop, the launch),
    the child is not due for a relaunch of the tracker's own, so exactly one new process starts. A
    launch that fails leaves the child to the tracker, which retries it with its back-off."""
    child = ManagedProcess("svc", [PYTHON, "-c", "import time; time.sleep(60)"], log_path=tmp_path / "s.log")
    child.launch()
    seen: list[bool] = []
    launch = child.launch

    def watched_launch() -> int:
        seen.append(child.due_for_relaunch(time.time() + 3600))  # a tracker tick just before the launch
        return launch()

    child.launch = watched_launch  # type: ignore[method-assign]
    try:
        first = child.pid
        new = child.restart(timeout=5)
        assert seen == [False] and new != first and child.pid == new
        assert not child.due_for_relaunch(time.time() + 3600)  # it runs

        child.argv = [str(tmp_path / "missing")]  # cannot be executed: the launch raises
        try:
            child.restart(timeout=5)
        except OSError:
            pass
        else:
            raise AssertionError("launching a missing program did not fail")
        assert child.due_for_relaunch(time.time() + 3600)  # the tracker's to retry
    finally:
        child.stopping = True
        child.stop(5)
