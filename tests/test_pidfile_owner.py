"""Whoever can write an instance's pidfile chooses the process medic signals and restarts: a pidfile
another user could rewrite (group/other write, a directory they control) is refused, and one owned
by a user other than root or medic's may only name that user's own processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.watch.discovery import by_pidfile
from support.procs import wait_until

NOBODY = 65534


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to hand files and processes to another user")


def pidfile_for(directory: Path, pid: int, owner: int | None = None, mode: int = 0o644) -> Path:
    path = directory / "svc.pid"
    path.write_text(f"{pid}\n")
    os.chmod(path, mode)
    if owner is not None:
        os.chown(path, owner, -1)
    return path


def test_a_pidfile_others_can_write_is_refused(spawn, tmp_path: Path) -> None:
    target = spawn(["sleep", "60"])
    identity, why = by_pidfile(pidfile_for(tmp_path, target.pid, mode=0o666))
    assert (
        identity is None and why is not None and "writable by group or others" in why and "chmod go-w" in why
    )
    identity, why = by_pidfile(pidfile_for(tmp_path, target.pid, mode=0o644))
    assert identity is not None and identity.pid == target.pid and why is None


def test_a_pidfile_in_a_directory_others_can_write_is_refused(spawn, tmp_path: Path) -> None:
    target = spawn(["sleep", "60"])
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    identity, why = by_pidfile(pidfile_for(shared, target.pid))
    assert identity is None and why is not None and "without the sticky bit" in why


@pytest.mark.root
def test_a_users_pidfile_may_name_only_that_users_process(spawn, tmp_path: Path) -> None:
    needs_root()
    as_nobody = [
        sys.executable,
        "-c",
        "import os,time; os.setgroups([]); os.setgid(65534); os.setuid(65534); time.sleep(60)",
    ]
    theirs = spawn(as_nobody)
    wait_until(lambda: os.stat(f"/proc/{theirs.pid}").st_uid == NOBODY, 10)
    identity, why = by_pidfile(pidfile_for(tmp_path, theirs.pid, owner=NOBODY))
    assert identity is not None and identity.pid == theirs.pid, why
    roots = spawn(["sleep", "60"])
    identity, why = by_pidfile(pidfile_for(tmp_path, roots.pid, owner=NOBODY))
    assert identity is None and why is not None
    assert f"belongs to uid {NOBODY}" in why and "runs as uid 0" in why


@pytest.mark.slow
@pytest.mark.root
def test_the_agent_refuses_another_users_pidfile_and_keeps_running(agent, spawn, tmp_path: Path) -> None:
    """The pidfile nobody owns names root's process: never up, so never restarted; once root owns
    the file the same agent adopts the process."""
    needs_root()
    target = spawn(["sleep", "300"])
    pidfile = pidfile_for(tmp_path, target.pid, owner=NOBODY)
    agent.start(
        {
            "agent": {"interval": "0.2s", "discovery_interval": "0.2s", "flush_interval": "0.3s"},
            "instances": [{"name": "svc", "match": {"pidfile": str(pidfile)}}],
            "remediation": {"mode": "enforce"},
        }
    )
    wait_until(lambda: f"belongs to uid {NOBODY}" in (agent.instance("svc").get("status_reason") or ""), 20)
    assert agent.instance("svc")["status"] != "up"
    restarted = agent.cli("restart", "svc", "--reason", "test", "--force")
    assert restarted.returncode in (0, 4), restarted.stderr  # accepted or refused: it must not kill
    time.sleep(2)  # ten ticks for the pipeline to act on the request
    assert target.poll() is None and agent.proc is not None and agent.proc.poll() is None
    os.chown(pidfile, 0, -1)
    wait_until(lambda: agent.instance("svc")["status"] == "up", 20)
    assert agent.instance("svc")["pid"] == target.pid
    assert subprocess.run(["kill", "-0", str(target.pid)]).returncode == 0
