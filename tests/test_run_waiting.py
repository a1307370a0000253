"""`medic run` never waits without a word: a `--pid` of no running process is a usage error at once,
and an instance of a config that has no process at start is named in the log, with how it is sought."""

from __future__ import annotations

import subprocess

import pytest

from support.agent_runner import medic_cli
from support.procs import PYTHON, wait_until


def gone_pid() -> int:
    """The pid of a process that ran and was reaped."""
    proc = subprocess.Popen([PYTHON, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


def test_a_pid_of_no_running_process_is_a_usage_error_at_once(tmp_path):
    pid = gone_pid()
    done = medic_cli("run", "--pid", str(pid), "--port", "0", "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"medic: error: --pid {pid}: no process {pid} is running; give the pid of a running process "
        "(`pgrep -f NAME`), or --match REGEX to wait for one\n"
    )
    assert not (tmp_path / "state").exists(), "refused before anything was written"


@pytest.mark.slow
def test_an_instance_without_a_process_at_start_is_named_in_the_log(agent, tmp_path):
    pid = gone_pid()
    agent.start(
        {
            "instances": [
                {"name": "gone", "match": {"pid": pid}},
                {"name": "later", "match": {"pidfile": str(tmp_path / "later.pid")}},
            ]
        }
    )
    log = wait_until(lambda: (text := agent.log.read_text()).count("medic keeps looking") >= 2 and text, 30)
    assert f"WARNING gone: no process found by pid {pid} (not found yet); medic keeps looking" in log
    assert f"WARNING later: no process found by pidfile {tmp_path / 'later.pid'} (pidfile " in log
    assert agent.instance("gone")["status"] == "waiting"
