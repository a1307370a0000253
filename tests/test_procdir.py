"""A followed process's /proc directory held open (probes.linux.procdir): read as the path readers
read, its identity checked once, and never a read past the process it was opened for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.core.errors import TargetGone
from agent.core.records import ProcessIdentity
from probes.linux import procfs, procstatus
from probes.linux.procdir import MAX_HELD, ProcDir, ProcDirs, hold_limit
from support.procs import wait_ready, wait_until

ROOT = Path(__file__).parent / "fixtures" / "proc"
WEIRD, KTHREAD, ZOMBIE = 10299, 2, 10300  # see tests/fixtures/README.md
FDS_CHILD = """
import os, sys, time
kept = [os.open(os.devnull, os.O_RDONLY) for _ in range(int(sys.argv[1]))]
print("ready", flush=True)
time.sleep(60)
"""


def own_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_held_or_not_it_reads_the_fixture_files_as_the_path_readers_do():
    identity = procfs.process_identity(WEIRD, ROOT)
    for hold in (True, False):
        proc = ProcDir(identity, ROOT, hold=hold)
        assert proc.held is hold
        assert proc.stat() == procfs.read_stat(WEIRD, ROOT)
        assert proc.status() == procstatus.parse_status(
            procfs.read_process_file(WEIRD, "status", ROOT), ids=False
        )
        assert proc.statm() == procfs.read_statm(WEIRD, ROOT)
        assert proc.count_fds() == proc.count_fds() == procfs.count_fds(WEIRD, ROOT) == 3
        proc.close()
    kthread = ProcDir(procfs.process_identity(KTHREAD, ROOT), ROOT)
    assert kthread.status().rss_bytes is None and kthread.statm().rss_bytes == 0


def test_status_holds_the_figures_of_statm():
    status, statm = procstatus.read_status(WEIRD, ROOT), procfs.read_statm(WEIRD, ROOT)
    assert (status.rss_bytes, status.vms_bytes) == (statm.rss_bytes, statm.vms_bytes)


def test_the_identity_is_checked_when_the_directory_is_opened():
    started = procfs.process_identity(WEIRD, ROOT).start_time
    with pytest.raises(TargetGone, match="belongs to another process"):
        ProcDir(ProcessIdentity(WEIRD, started - 5), ROOT)
    with pytest.raises(TargetGone, match="belongs to another process"):
        ProcDir(ProcessIdentity(WEIRD, started - 5), ROOT, hold=False).stat()  # by path: on every stat
    with pytest.raises(TargetGone, match="zombie"):
        ProcDir(ProcessIdentity(ZOMBIE, 0.0), ROOT)
    with pytest.raises(TargetGone, match="process 999999 is gone"):
        ProcDir(ProcessIdentity(999999, 1.0), ROOT)


def test_a_held_directory_never_reads_past_its_process(spawn):
    child = spawn(["sleep", "60"])
    # asleep in its timer: its start-up, and the locale file it opens and closes there, is over
    wait_until(lambda: procfs.read_stat(child.pid).state == "S")
    identity = procfs.process_identity(child.pid)
    proc = ProcDir(identity)
    assert proc.stat().pid == child.pid and proc.held
    assert proc.count_fds() == len(os.listdir(f"/proc/{child.pid}/fd"))
    child.kill()
    wait_until(lambda: procfs.read_stat(child.pid).state == "Z")  # exited, not reaped yet
    with pytest.raises(TargetGone, match="zombie"):
        proc.stat()
    child.wait()
    for read in (proc.stat, proc.status, proc.statm, proc.count_fds):
        with pytest.raises(TargetGone):  # ESRCH, whoever has the pid now
            read()
    proc.close()


def test_the_fd_count_follows_the_process(spawn):
    for extra in (0, 40):
        child = spawn([sys.executable, "-c", FDS_CHILD, str(extra)], stdout=subprocess.PIPE, text=True)
        wait_ready(child)
        proc = ProcDir(procfs.process_identity(child.pid))
        counts = [proc.count_fds() for _ in range(3)]  # a listing first, then the size where it counts
        assert counts == [len(os.listdir(f"/proc/{child.pid}/fd"))] * 3
        assert counts[0] >= extra + 3
        proc.close()


def test_the_table_holds_at_most_its_limit_and_closes_what_it_leaves(spawn):
    children = [spawn(["sleep", "60"]) for _ in range(3)]
    identities = [procfs.process_identity(child.pid) for child in children]
    dirs, before = ProcDirs(limit=2), own_fds()
    for identity in identities:
        with dirs.using(identity) as proc:
            assert proc.stat().pid == identity.pid
    assert dirs.held() == 2 and own_fds() == before + 2  # the third is read by path
    with dirs.using(identities[2]) as proc:
        assert not proc.held
    dirs.forget(identities[0])
    assert dirs.held() == 1 and own_fds() == before + 1
    children[1].kill()
    children[1].wait()
    with pytest.raises(TargetGone), dirs.using(identities[1]) as proc:
        proc.stat()
    assert dirs.held() == 0 and own_fds() == before  # a process gone for good gives its directory back
    with dirs.using(identities[2]) as proc:
        assert proc.held
    dirs.close()
    assert dirs.held() == 0 and own_fds() == before


def test_the_limit_leaves_most_descriptors_to_the_rest_of_medic():
    assert 0 < hold_limit() <= MAX_HELD
