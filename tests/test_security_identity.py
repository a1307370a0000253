"""Process identity, managed children across an agent crash, PID 1 reaping, and the `select: all` cap.

All on real processes: a pid really reused by an unrelated program (a C helper compiled here, aimed
with ns_last_pid as root), a real agent killed with -9 and started again, medic as PID 1 of a real
pid namespace.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import yaml

from agent.config.model import InstanceSpec
from agent.core.errors import ConfigError
from agent.jobs.remediation import view_from_state
from agent.state.eventlog import EventLog
from agent.state.identities import AdoptedProcess, IdentityLedger, pidfile_rewritten
from agent.state.store import Store
from agent.watch.tracker import Tracker
from probes.linux.pidfd import Expected, check, pin, signal_if_same
from probes.linux.procfs import process_identity
from remediation.actuators import SignalActuator
from remediation.model import RemediationRequest
from support.procs import PYTHON, REPO, wait_until

FAST = {"interval": "0.2s", "slow_interval": "1s", "discovery_interval": "0.3s", "flush_interval": "0.3s"}
REQUEST = RemediationRequest("served", "leak", "f-1", "test")

# The unrelated program: it takes a given pid (fork until it comes round, aimed with ns_last_pid
# when that is writable), then logs every catchable signal it receives to a file, forever.
PIDREUSE_C = r"""
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static int log_fd = -1;

static void on_signal(int sig) {
    char line[16];
    int n = snprintf(line, sizeof line, "%d\n", sig);
    if (write(log_fd, line, (size_t)n) < 0) _exit(3);
}

static void victim(const char *log) {
    log_fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
    if (log_fd < 0) _exit(4);
    int null = open("/dev/null", O_RDWR);
    for (int fd = 0; fd < 3; fd++) dup2(null, fd);  /* the test waits for EOF on our stdout */
    for (int sig = 1; sig < 32; sig++)
        if (sig != SIGKILL && sig != SIGSTOP && sig != SIGCHLD) signal(sig, on_signal);
    setsid();
    for (;;) pause();
}

static void aim(pid_t target) {
    FILE *f = fopen("/proc/sys/kernel/ns_last_pid", "w");
    if (!f) return;
    fprintf(f, "%d", (int)target - 1);
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: %s PID LOG\n", argv[0]); return 64; }
    pid_t target = (pid_t)atoi(argv[1]);
    for (long tries = 0; tries < 300000; tries++) {
        if (tries < 100) aim(target);
        pid_t pid = fork();
        if (pid < 0) { if (errno == EAGAIN) continue; return 5; }
        if (pid == 0) { if (getpid() == target) victim(argv[2]); _exit(0); }
        if (pid == target) { printf("%d\n", (int)pid); return 0; }
        waitpid(pid, NULL, 0);
    }
    return 2;
}
"""


def needs_root() -> None:
    if os.geteuid() != 0 or not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("needs root to aim pids with /proc/sys/kernel/ns_last_pid")


@pytest.fixture
def take_pid(tmp_path):
    """`take_pid(pid) -> (victim pid, its signal log)`: an unrelated program now holds `pid`."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    binary = tmp_path / "pidreuse"
    source = tmp_path / "pidreuse.c"
    source.write_text(PIDREUSE_C)
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(source)], check=True, capture_output=True)
    victims: list[psutil.Process] = []

    def take(pid: int) -> tuple[int, Path]:
        log = tmp_path / f"signals-{pid}.log"
        log.touch()
        done = subprocess.run([str(binary), str(pid), str(log)], capture_output=True, text=True, timeout=60)
        if done.returncode == 2:
            pytest.skip(f"pid {pid} was taken by another process first")
        assert done.returncode == 0, done.stderr
        victims.append(psutil.Process(pid))
        wait_until(lambda: psutil.Process(pid).exe() == str(binary), 5)
        return pid, log

    yield take
    for victim in victims:
        try:
            victim.kill()  # psutil checks the start time: a pid reused again is left alone
        except psutil.Error:
            pass


def sleeper(spawn, marker: str) -> subprocess.Popen:
    proc = spawn([PYTHON, "-c", "import time; time.sleep(600)", marker])
    wait_until(lambda: marker in " ".join(psutil.Process(proc.pid).cmdline()), 5)
    return proc


def kill_and_reap(proc: subprocess.Popen) -> None:
    # start times count clock ticks (10 ms): a pid reused within the tick its first owner started
    # in would look like the same process; a real service lives longer than that, so must ours
    time.sleep(0.05)
    proc.kill()
    proc.wait()


def untouched(victim: int, log: Path) -> bool:
    return psutil.pid_exists(victim) and psutil.Process(victim).status() != "zombie" and not log.read_text()


def copies(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (zombies do not count)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and marker in (proc.info["cmdline"] or []):
            found.append(proc.pid)
    return found


def unique(tag: str) -> str:
    return f"medic-test-{tag}-{os.getpid()}-{time.monotonic_ns()}"


def tracker_for(tmp_path: Path, pidfile: Path) -> tuple[Tracker, Store]:
    spec = InstanceSpec.model_validate({"name": "served", "match": {"pidfile": str(pidfile)}})
    store = Store(tmp_path / "state")
    return Tracker([spec], store, EventLog(store)), store


def kinds(store: Store) -> list[tuple[str, str]]:
    return [(e.kind, e.message) for e in reversed(store.events(limit=100))]


# ----------------------------------------------------------------------------- the identity helper


def test_signal_if_same_refuses_another_start_time_or_program(spawn):
    proc = spawn([PYTHON, "-c", "import signal, time; signal.signal(signal.SIGUSR1, signal.SIG_IGN); "
                  "time.sleep(60)"])  # fmt: skip
    wait_until(lambda: (psutil.Process(proc.pid).cmdline() or [""])[-1].endswith("time.sleep(60)"), 5)
    real = process_identity(proc.pid)
    verdict = signal_if_same(Expected(proc.pid, real.start_time - 5.0), signal.SIGTERM)
    assert verdict.reason == "pid-reused" and "another process" in verdict.message
    verdict = signal_if_same(Expected(proc.pid, real.start_time, exe="/usr/bin/not-this"), signal.SIGTERM)
    assert verdict.reason == "exe-mismatch"
    verdict = signal_if_same(Expected(proc.pid, real.start_time, cmdline=("sleep", "1")), signal.SIGTERM)
    assert verdict.reason == "cmdline-mismatch"
    assert proc.poll() is None  # nothing was sent
    assert check(Expected(proc.pid, real.start_time, session_leader=True)).ok  # spawn: its own session
    with pin(Expected(proc.pid, real.start_time)) as pinned:
        assert pinned.send(signal.SIGTERM) and pinned.wait_exit(5)
    proc.wait()
    assert signal_if_same(Expected(proc.pid, real.start_time), signal.SIGTERM).reason == "gone"


# ----------------------------------------------------------------------------- pid reuse


@pytest.mark.root
def test_tracker_never_adopts_an_unrelated_process_at_the_pidfile_pid(spawn, tmp_path, take_pid):
    """The pidfile's process exits and its pid goes to another program: the instance is down (one
    clear event), the newcomer is not followed, so the signal actuator has nothing to signal. The
    same holds for the next agent, which knows from identities.json what the instance ran."""
    needs_root()
    target = sleeper(spawn, unique("served"))
    pidfile = tmp_path / "served.pid"
    pidfile.write_text(f"{target.pid}\n")
    tracker, store = tracker_for(tmp_path, pidfile)
    tracker.reconcile(scan=True)
    state = tracker.get("served")
    assert state.status == "up" and state.pid == target.pid
    kill_and_reap(target)
    victim, log = take_pid(target.pid)
    for _ in range(3):
        tracker.reconcile(scan=True)
    assert state.status == "down" and "another program" in state.status_reason, kinds(store)
    refused = [m for k, m in kinds(store) if k == "instance_down" and "not adopted" in m]
    assert len(refused) == 1 and f"pid {victim} is another process" in refused[0], kinds(store)
    assert "instance_restarted" not in [k for k, _ in kinds(store)]
    view = view_from_state(state)
    decision = SignalActuator(lambda name: None, grace=0.2).restart(view, REQUEST, 2)
    assert not decision.ok and decision.code == "no-process"
    store.close()

    again, store = tracker_for(tmp_path, pidfile)  # an agent started later: same refusal
    again.reconcile(scan=True)
    assert again.get("served").status == "down" and again.get("served").pid is None
    assert any(k == "instance_down" and "not adopted" in m for k, m in kinds(store))
    store.close()
    time.sleep(0.3)
    assert untouched(victim, log)


def write_pidfile(path: Path, pid: int) -> None:
    """As a service manager does: a new file renamed into place, after the process exists."""
    staging = path.with_suffix(".new")
    staging.write_text(f"{pid}\n")
    os.replace(staging, path)


def test_a_pidfile_service_redeployed_with_another_command_line_is_its_restart(spawn, tmp_path):
    """A new version (other arguments) started by the service manager, which writes the pidfile
    anew: a restart of the same instance, while medic watches and while it did not."""
    first = sleeper(spawn, unique("v1"))
    pidfile = tmp_path / "served.pid"
    write_pidfile(pidfile, first.pid)
    tracker, store = tracker_for(tmp_path, pidfile)
    tracker.reconcile(scan=True)
    assert tracker.get("served").pid == first.pid
    kill_and_reap(first)
    second = sleeper(spawn, unique("v2 --new-flag"))
    write_pidfile(pidfile, second.pid)
    tracker.reconcile(scan=True)
    state = tracker.get("served")
    assert state.status == "up" and state.pid == second.pid, kinds(store)
    assert [k for k, _ in kinds(store)].count("instance_restarted") == 1
    assert not [m for k, m in kinds(store) if "not adopted" in m]
    assert IdentityLedger(store.dir).get("served").cmdline == tuple(psutil.Process(second.pid).cmdline())
    store.close()

    kill_and_reap(second)  # and while no agent watched: the next agent knows from identities.json
    third = sleeper(spawn, unique("v3"))
    write_pidfile(pidfile, third.pid)
    again, store = tracker_for(tmp_path, pidfile)
    again.reconcile(scan=True)
    assert again.get("served").status == "up" and again.get("served").pid == third.pid, kinds(store)
    assert any(k == "instance_restarted" and "not watching" in m for k, m in kinds(store))
    store.close()


def test_pidfile_rewritten_needs_a_new_stamp_written_after_the_process_started():
    record = AdoptedProcess(10, 1000.0, "/bin/x", ("x",), "pidfile:/p", pidfile_stamp=(int(1000.2e9), 7))
    assert not pidfile_rewritten(record, (int(1000.2e9), 7), 2000.0)[0]  # untouched: a reused pid
    assert "unchanged" in pidfile_rewritten(record, (int(1000.2e9), 7), 2000.0)[1]
    assert not pidfile_rewritten(record, (int(1500e9), 8), 2000.0)[0]  # written before it started
    assert pidfile_rewritten(record, (int(2000.1e9), 8), 2000.0)[0]
    assert pidfile_rewritten(record, (int(2000.1e9), 7), 2000.0)[0]  # rewritten in place
    assert not pidfile_rewritten(record, None, 2000.0)[0]


@pytest.mark.root
def test_a_refused_pid_is_refused_only_while_it_holds_the_pidfile_pid(spawn, tmp_path, take_pid):
    """A pidfile rewritten for the process itself (a reload) is no licence for its successor; once
    the unrelated process is gone, a new version with a rewritten pidfile is adopted as usual."""
    needs_root()
    target = sleeper(spawn, unique("served"))
    pidfile = tmp_path / "served.pid"
    write_pidfile(pidfile, target.pid)
    tracker, store = tracker_for(tmp_path, pidfile)
    tracker.reconcile(scan=True)
    later = time.time() + 30  # rewritten while it runs, stamped late enough to cover any newcomer
    os.utime(pidfile, (later, later))
    tracker.reconcile(scan=True)
    kill_and_reap(target)
    victim, _log = take_pid(target.pid)
    tracker.reconcile(scan=True)
    state = tracker.get("served")
    assert state.status == "down" and "not written anew" in state.status_reason, kinds(store)
    store.close()
    again, store = tracker_for(tmp_path, pidfile)
    again.reconcile(scan=True)
    assert again.get("served").status == "down", kinds(store)

    psutil.Process(victim).kill()
    wait_until(lambda: not psutil.pid_exists(victim) or psutil.Process(victim).status() == "zombie", 5)
    again.reconcile(scan=True)
    state = again.get("served")
    assert (
        state.status == "down"
        and state.refused is None
        and "not the instance, is gone" in state.status_reason
    )
    successor = sleeper(spawn, unique("v2"))
    write_pidfile(pidfile, successor.pid)
    again.reconcile(scan=True)
    assert state.status == "up" and state.pid == successor.pid, kinds(store)
    assert IdentityLedger(store.dir).get("served").pid == successor.pid
    store.close()


@pytest.mark.root
@pytest.mark.slow
def test_agent_reports_a_reused_pidfile_pid_gone_and_never_signals_it(agent, spawn, tmp_path, take_pid):
    needs_root()
    marker = unique("served")
    target = sleeper(spawn, marker)
    pidfile = tmp_path / "served.pid"
    pidfile.write_text(f"{target.pid}\n")
    agent.start(
        {
            "agent": FAST,
            "remediation": {"mode": "enforce", "interval": "0.3s"},
            "instances": [{"name": "served", "match": {"pidfile": str(pidfile)}}],
        }
    )
    wait_until(lambda: agent.instance("served")["status"] == "up", 10)
    kill_and_reap(target)
    victim, log = take_pid(target.pid)

    def refused() -> list[dict]:
        return [e for e in agent.events(kind="instance_down") if "not adopted" in e["message"]]

    wait_until(refused, 10)
    assert refused()[0]["data"]["other_pid"] == victim
    detail = agent.instance("served")
    assert detail["status"] == "down" and "another program" in detail["status_reason"]
    restart = agent.cli("restart", "served", "--force", "--reason", "try the reused pid")
    time.sleep(1.0)
    assert not [e for e in agent.events(kind="instance_restarted") if e["instance"] == "served"]
    assert agent.instance("served")["status"] == "down", restart.stdout + restart.stderr
    assert untouched(victim, log), log.read_text()


@pytest.mark.slow
def test_a_pidfile_replaced_by_a_fifo_or_a_symlink_leaves_the_agent_running_and_shows_nothing(
    agent, spawn, tmp_path
):
    target = sleeper(spawn, unique("pidfiled"))
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o777)
    run_dir.chmod(0o1777)  # the target's own directory: it may put anything at its pidfile's name
    pidfile = run_dir / "served.pid"
    pidfile.write_text(f"{target.pid}\n")
    secret = tmp_path / "root-only"
    secret.write_text("ROOT-ONLY-SECRET-0123\n")
    secret.chmod(0o600)
    agent.start({"agent": FAST, "instances": [{"name": "served", "match": {"pidfile": str(pidfile)}}]})
    wait_until(lambda: agent.instance("served")["status"] == "up", 10)

    def down_because(text: str):
        return [e for e in agent.events(kind="instance_down") if text in e["message"]]

    pidfile.unlink()
    os.mkfifo(pidfile)  # no writer: an open for reading would block the tracker for ever
    wait_until(lambda: down_because("not a regular file"), 10)
    assert agent.get("/healthz")["status"] == "ok"
    pidfile.unlink()
    pidfile.write_text(f"{target.pid}\n")
    wait_until(lambda: agent.instance("served")["status"] == "up", 10)
    pidfile.unlink()
    pidfile.symlink_to(secret)  # its first line would be shown as "does not hold a pid: ..."
    wait_until(lambda: down_because("is a symlink"), 10)
    assert "ROOT-ONLY-SECRET" not in json.dumps([agent.instance("served"), agent.events()])


# ----------------------------------------------------------------------------- managed children


def managed_config(marker: str, **extra) -> dict:
    argv = [PYTHON, "-c", "import time; time.sleep(600)", marker]
    return {
        "agent": FAST,
        "instances": [{"name": "svc", "match": {"command": argv}, "stop_timeout": 2, **extra}],
    }


@pytest.mark.slow
def test_kill_9_of_the_agent_then_a_restart_leaves_one_copy_and_stop_leaves_none(agent):
    marker = unique("managed")
    config = managed_config(marker)
    agent.start(config)
    wait_until(lambda: agent.instance("svc")["status"] == "up", 10)
    first = agent.instance("svc")["pid"]
    agent.stop(signal.SIGKILL)
    assert copies(marker) == [first]  # the child outlives the agent

    agent.start(config)
    wait_until(lambda: agent.instance("svc")["status"] == "up", 10)
    time.sleep(1.0)  # a few ticks: nothing else may be launched
    assert copies(marker) == [first]
    assert "instance_adopted" in [e["kind"] for e in agent.events()]
    assert (agent.state_dir / "identities.json").stat().st_mode & 0o777 == 0o600
    detail = agent.instance("svc")
    assert detail["status"] == "up" and detail["pid"] == first and detail["restarts"] == 0
    svc_kinds = [e["kind"] for e in agent.events() if e["instance"] == "svc"]
    assert "instance_restarted" not in svc_kinds and "instance_down" not in svc_kinds

    os.kill(first, signal.SIGKILL)  # the adopted child ends: relaunched, as any managed child
    wait_until(lambda: agent.instance("svc")["pid"] not in (None, first), 15)
    exited = [e for e in agent.events(kind="instance_exited") if e["instance"] == "svc"]
    assert exited and "exit status is unknown" in exited[0]["message"]
    wait_until(lambda: len(copies(marker)) == 1 and first not in copies(marker), 5)
    second = copies(marker)[0]

    agent.stop(signal.SIGKILL)  # and once more: the relaunched child is adopted, then stopped with the agent
    agent.start(config)
    wait_until(lambda: agent.instance("svc")["pid"] == second, 10)
    assert copies(marker) == [second]
    assert agent.stop() == 0
    wait_until(lambda: not copies(marker), 5)


@pytest.mark.slow
def test_a_child_whose_command_changed_is_stopped_not_kept(agent):
    old, new = unique("old"), unique("new")
    agent.start(managed_config(old))
    wait_until(lambda: agent.instance("svc")["status"] == "up", 10)
    agent.stop(signal.SIGKILL)
    assert len(copies(old)) == 1
    agent.start(managed_config(new))
    wait_until(lambda: not copies(old) and len(copies(new)) == 1, 10)
    stopped = [e for e in agent.events() if e["kind"] == "instance_orphan_stopped"]
    assert stopped and "its command changed" in stopped[0]["message"]


# ----------------------------------------------------------------------------- PID 1


@pytest.mark.root
@pytest.mark.slow
def test_as_pid_1_medic_reaps_orphans_and_keeps_the_exit_status(tmp_path):
    """In a pid namespace of its own (a container without an init), medic is PID 1: an orphan that
    exits must be reaped, and medic still ends with the command's status."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a pid namespace")
    script = "(sleep 0.3 &); (sleep 0.3 &); sleep 4; exit 3"
    argv = ["unshare", "--pid", "--fork", "--mount-proc", PYTHON, "-m", "agent.cli.main", "run",
            "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "state"), "--interval", "0.2s",
            "--", "sh", "-c", script]  # fmt: skip
    proc = subprocess.Popen(
        argv, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        wait_until(lambda: (tmp_path / "state" / "agent.json").exists(), 30)
        time.sleep(1.5)  # the orphans have exited by now

        def zombies() -> list[psutil.Process]:
            try:
                tree = psutil.Process(proc.pid).children(recursive=True)
            except psutil.Error:
                return []
            return [p for p in tree if p.status() == psutil.STATUS_ZOMBIE]

        assert not zombies(), [(p.pid, p.name()) for p in zombies()]
        assert proc.wait(timeout=30) == 3, proc.stderr.read().decode() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()


# ----------------------------------------------------------------------------- select: all cap


@pytest.mark.slow
def test_select_all_follows_at_most_max_instances_and_says_so_once(agent, spawn):
    marker = unique("many")
    for _ in range(5):
        sleeper(spawn, marker)
    agent.start(
        {
            "agent": FAST,
            "instances": [
                {"name": "every", "match": {"cmdline": marker, "select": "all", "max_instances": 3}}
            ],
        }
    )
    wait_until(lambda: sum(i["status"] == "up" for i in agent.get("/api/v1/instances")["instances"]) == 3, 10)
    time.sleep(1.5)  # several discovery scans
    names = sorted(i["name"] for i in agent.get("/api/v1/instances")["instances"])
    assert names == ["every-0", "every-1", "every-2"]
    capped = agent.events(kind="instance_cap_reached")
    assert len(capped) == 1 and capped[0]["data"] == {"max_instances": 3, "not_followed": 2}
    assert "raise max_instances" in capped[0]["message"]


@pytest.mark.parametrize(
    ("match", "error"),
    [
        ({"cmdline": "x", "select": "all", "max_instances": 0}, "greater than or equal to 1"),
        ({"cmdline": "x", "select": "all", "max_instances": 5000}, "less than or equal to 1024"),
        ({"pid": 10, "max_instances": 3}, "max_instances applies only to `cmdline` with `select: all`"),
    ],
)
def test_max_instances_is_bounded_and_only_for_select_all(tmp_path, match, error):
    from agent.config.loader import load_config

    path = tmp_path / "medic.yaml"
    path.write_text(yaml.safe_dump({"instances": [{"name": "x", "match": match}]}))
    with pytest.raises(ConfigError, match="instances") as raised:
        load_config(path)
    assert error in str(raised.value)
