"""Actuators, drain and verification against real processes and a real loopback HTTP server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agent.watch.discovery import by_pid
from probes.linux.procfs import process_identity, read_cmdline
from remediation.actuators import (
    CommandActuator,
    HttpActuator,
    ManagedActuator,
    SignalActuator,
    check_identity,
)
from remediation.config import DrainSection
from remediation.drain import Drain
from remediation.model import Decision, InstanceView, RemediationRequest
from remediation.verify import Verifier
from support.procs import PATIENCE, PYTHON, free_port, wait_until
from support.remediation import HttpRecorder, dripping_server

SUPERVISOR = """
import os, subprocess, sys, time
pidfile, argv = sys.argv[1], sys.argv[2:]
while True:
    child = subprocess.Popen(argv)
    with open(pidfile + ".tmp", "w") as out:
        out.write(str(child.pid))
    os.replace(pidfile + ".tmp", pidfile)
    child.wait()
    time.sleep(0.1)
"""
IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"
SLEEPER = "import time; time.sleep(600)"
REQUEST = RemediationRequest("serving-1", "leak", "F42", "leaks 41 MB/h")


def view_of(name: str, pid: int, **kw) -> InstanceView:
    identity = process_identity(pid)
    return InstanceView(name, pid, identity.start_time, tuple(read_cmdline(pid)), **kw)


def alive(pid: int) -> bool:
    return by_pid(pid) is not None


class Supervised:
    """A real supervisor process that relaunches `argv` when it exits and writes the child's pid to a file."""

    def __init__(self, spawn, tmp_path: Path, code: str) -> None:
        self.pidfile = tmp_path / "child.pid"
        self.proc = spawn([PYTHON, "-c", SUPERVISOR, str(self.pidfile), PYTHON, "-c", code])
        wait_until(lambda: self.locate("x") is not None, 10)

    def locate(self, name: str):
        try:
            return by_pid(int(self.pidfile.read_text()))
        except (OSError, ValueError):
            return None


# ----------------------------------------------------------------------------- signal


def test_signal_restarts_a_real_supervised_process(spawn, tmp_path):
    sup = Supervised(spawn, tmp_path, SLEEPER)
    old = sup.locate("serving-1")
    view = view_of("serving-1", old.pid)
    decision = SignalActuator(sup.locate, grace=5, start_timeout=10).restart(view, REQUEST, 30)
    assert decision.ok, decision.reason
    assert "sent SIGTERM" in decision.reason and decision.data["new_pid"] != old.pid
    assert not alive(old.pid)
    assert sup.locate("serving-1").pid == decision.data["new_pid"]


def test_signal_kills_after_the_grace_period_when_term_is_ignored(spawn, tmp_path):
    sup = Supervised(spawn, tmp_path, IGNORES_TERM)
    old = sup.locate("serving-1")
    time.sleep(0.3)  # let it install its handler
    started = time.monotonic()
    decision = SignalActuator(sup.locate, grace=0.5, start_timeout=10).restart(
        view_of("s", old.pid), REQUEST, 30
    )
    assert decision.ok, decision.reason
    assert "then KILL after 0.5s" in decision.reason
    assert time.monotonic() - started >= 0.5 and not alive(old.pid)


def test_signal_without_kill_reports_a_process_that_will_not_stop(spawn, tmp_path):
    proc = spawn([PYTHON, "-c", IGNORES_TERM], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("ready")
    decision = SignalActuator(lambda n: None, grace=0.3, kill=False).restart(
        view_of("s", proc.pid), REQUEST, 5
    )
    assert not decision.ok and decision.code == "still-running" and proc.poll() is None


def test_signal_reports_when_nothing_brings_the_process_back(spawn):
    proc = spawn([PYTHON, "-c", SLEEPER])
    time.sleep(0.2)
    view = view_of("s", proc.pid)
    decision = SignalActuator(lambda n: by_pid(proc.pid), grace=2, start_timeout=0.5).restart(
        view, REQUEST, 5
    )
    assert not decision.ok and decision.code == "not-restarted"
    assert "supervisor" in decision.reason


def test_signal_never_touches_another_program_with_a_different_start_time(spawn):
    other = spawn(["sleep", "600"])
    time.sleep(0.1)
    real = view_of("serving-1", other.pid)
    stale = InstanceView("serving-1", other.pid, real.start_time - 100.0, real.cmdline)
    decision = SignalActuator(lambda n: None).restart(stale, REQUEST, 5)
    assert not decision.ok and decision.code == "pid-reused" and "not signalled" in decision.reason
    time.sleep(0.2)
    assert other.poll() is None


def test_signal_never_touches_a_process_whose_cmdline_differs(spawn):
    other = spawn(["sleep", "600"])
    time.sleep(0.1)
    real = view_of("serving-1", other.pid)
    wrong = InstanceView("serving-1", other.pid, real.start_time, ("/usr/bin/model_server", "--port", "8501"))
    decision = SignalActuator(lambda n: None).restart(wrong, REQUEST, 5)
    assert not decision.ok and decision.code == "cmdline-mismatch"
    time.sleep(0.2)
    assert other.poll() is None


def test_signal_on_a_gone_process_is_refused():
    proc = subprocess.Popen([PYTHON, "-c", "pass"])
    view = view_of("s", proc.pid) if by_pid(proc.pid) else InstanceView("s", proc.pid, time.time(), ())
    proc.wait()
    decision = SignalActuator(lambda n: None).restart(view, REQUEST, 5)
    assert not decision.ok and decision.code in ("gone", "pid-reused")
    assert check_identity(InstanceView("s", None, None)).code == "no-process"


@pytest.mark.root
def test_a_really_reused_pid_is_never_signalled(spawn):
    """The instance's pid is freed, then given to another program (via ns_last_pid): it must survive."""
    if os.geteuid() != 0 or not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("needs root to write /proc/sys/kernel/ns_last_pid")
    for _ in range(30):
        instance = subprocess.Popen([PYTHON, "-c", SLEEPER])
        time.sleep(0.1)
        view = view_of("serving-1", instance.pid)
        instance.kill()
        instance.wait()
        with open("/proc/sys/kernel/ns_last_pid", "w") as out:
            out.write(str(view.pid - 1))
        impostor = spawn(["sleep", "600"])
        if impostor.pid == view.pid:
            break
    else:
        pytest.skip("could not get the pid reused (other processes forked in between)")
    time.sleep(0.1)
    decision = SignalActuator(lambda n: None, grace=0.2).restart(view, REQUEST, 5)
    assert not decision.ok and decision.code == "pid-reused", decision.reason
    time.sleep(0.2)
    assert impostor.poll() is None


# ----------------------------------------------------------------------------- exec


def test_exec_runs_argv_with_placeholders_and_captures_output(tmp_path):
    marker = tmp_path / "out.txt"
    argv = [PYTHON, "-c", "import sys; open(sys.argv[1], 'w').write(' '.join(sys.argv[2:])); print('restarted')",
            str(marker), "{instance}", "{pid}", "{fleet}", "{finding_id}", "{kind}", "a;b && $(c)"]  # fmt: skip
    view = InstanceView("serving-1", 4242, 1.0, labels={"fleet": "ranker"})
    decision = CommandActuator(argv, timeout=10).restart(view, REQUEST, 30)
    assert decision.ok, decision.reason
    assert (
        marker.read_text() == "serving-1 4242 ranker F42 leak a;b && $(c)"
    )  # no shell: metacharacters stay text
    assert decision.data["output"].strip() == "restarted"


def test_exec_failure_reports_status_and_output_tail():
    argv = [
        PYTHON,
        "-c",
        "import sys; print('x' * 20000); print('unit model@serving-1 not found'); sys.exit(5)",
    ]
    decision = CommandActuator(argv, timeout=10).restart(InstanceView("s", 1, 1.0), REQUEST, 30)
    assert not decision.ok and decision.code == "failed"
    assert "status 5" in decision.reason and "unit model@serving-1 not found" in decision.reason
    assert len(decision.data["output"]) <= 8192


def test_exec_hang_is_killed_with_its_children(tmp_path):
    grandchild_file = tmp_path / "grandchild.pid"
    code = (
        "import subprocess, sys, time; p = subprocess.Popen(['sleep', '600']); "
        f"open({str(grandchild_file)!r}, 'w').write(str(p.pid)); time.sleep(600)"
    )
    started = time.monotonic()
    decision = CommandActuator([PYTHON, "-c", code], timeout=1.0).restart(
        InstanceView("s", 1, 1.0), REQUEST, 30
    )
    assert not decision.ok and decision.code == "timeout" and "did not finish within 1s" in decision.reason
    assert time.monotonic() - started < 5 * PATIENCE
    grandchild = int(grandchild_file.read_text())
    wait_until(lambda: not alive(grandchild), 5)


def test_exec_missing_program_says_so():
    decision = CommandActuator(["/nonexistent/restart-it"]).restart(InstanceView("s", 1, 1.0), REQUEST, 5)
    assert not decision.ok and decision.code == "cannot-run" and "check the command" in decision.reason


# ----------------------------------------------------------------------------- http


def test_http_posts_the_instance_and_reason():
    with HttpRecorder() as server:
        server.respond("/admin/restart/serving-1", 202, {"ok": True})
        decision = HttpActuator(server.url + "/admin/restart/{instance}", headers={"X-Token": "t"}).restart(
            InstanceView("serving-1", 7, 1.0), REQUEST, 5
        )
        assert decision.ok and "HTTP 202" in decision.reason
        (req,) = server.requests
        assert req["method"] == "POST" and req["headers"]["X-Token"] == "t"
        body = json.loads(req["body"])
        assert body["instance"] == "serving-1" and body["finding_id"] == "F42" and body["pid"] == 7


@pytest.mark.parametrize("status, delay, code", [(500, 0.0, "http-error"), (200, 2.0, "timeout")])
def test_http_error_or_hang_is_a_failure(status, delay, code):
    with HttpRecorder() as server:
        server.respond("/restart", status, {"error": "boom"}, delay=delay)
        decision = HttpActuator(server.url + "/restart", timeout=0.5).restart(
            InstanceView("s", 1, 1.0), REQUEST, 5
        )
        assert not decision.ok and decision.code == code


def test_an_actuator_endpoint_that_drips_its_answer_is_a_timeout_not_a_held_restart():
    with dripping_server() as url:
        started = time.monotonic()
        decision = HttpActuator(url + "/restart", timeout=0.3).restart(InstanceView("s", 1, 1.0), REQUEST, 5)
        assert not decision.ok and decision.code == "timeout"
        assert time.monotonic() - started < 2.5 * PATIENCE


def test_http_unreachable_is_a_failure():
    decision = HttpActuator(f"http://127.0.0.1:{free_port()}/restart").restart(
        InstanceView("s", 1, 1.0), REQUEST, 5
    )
    assert not decision.ok and decision.code == "unreachable"


# ----------------------------------------------------------------------------- managed


def test_managed_calls_the_injected_restart():
    calls = []
    actuator = ManagedActuator(lambda name, timeout: calls.append((name, timeout)) or 999, timeout=7)
    decision = actuator.restart(InstanceView("onnx-0", 5, 1.0, managed=True), REQUEST, 30)
    assert decision.ok and decision.data["new_pid"] == 999 and calls == [("onnx-0", 7)]


@pytest.mark.parametrize("result, code", [(None, "not-restarted"), (RuntimeError("spawn failed"), "failed")])
def test_managed_failures_are_reported(result, code):
    def restart(name, timeout):
        if isinstance(result, Exception):
            raise result
        return result

    decision = ManagedActuator(restart).restart(InstanceView("onnx-0", 5, 1.0), REQUEST, 30)
    assert not decision.ok and decision.code == code


# ----------------------------------------------------------------------------- verify and drain


def test_verify_waits_for_a_new_stable_process_and_health_and_warmup(spawn, tmp_path):
    sup = Supervised(spawn, tmp_path, SLEEPER)
    old = sup.locate("s")
    before = view_of("s", old.pid)
    gate_calls = []

    def gate(view, deadline):
        gate_calls.append((view.pid, deadline))
        return Decision.allow("warmup", "p99 back under SLO")

    with HttpRecorder() as server:
        server.respond("/healthz", 200, {"ok": True})
        os.kill(old.pid, signal.SIGTERM)
        verifier = Verifier(
            sup.locate, timeout=10, stable_for=0.5, health_url=server.url + "/healthz", warmup_gate=gate
        )
        decision = verifier.verify(before, REQUEST, threading.Event())
    assert decision.ok, decision.reason
    new = decision.data["new_pid"]
    assert new != old.pid and gate_calls and gate_calls[0][0] == new
    assert set(decision.data["timings"]) == {"process_up", "healthy", "warm"}


def test_verify_fails_when_the_new_process_keeps_crashing(spawn, tmp_path):
    sup = Supervised(spawn, tmp_path, "import time; time.sleep(0.3)")
    before = InstanceView("s", 1, 1.0)
    decision = Verifier(sup.locate, timeout=2, stable_for=1.0).verify(before, REQUEST, threading.Event())
    assert not decision.ok and decision.code == "not-up"


def test_verify_fails_when_warmup_gate_refuses(spawn, tmp_path):
    sup = Supervised(spawn, tmp_path, SLEEPER)
    gate = lambda view, deadline: Decision.block("warmup", "slow", "p99 still 300 ms")  # noqa: E731
    decision = Verifier(sup.locate, timeout=5, stable_for=0.2, warmup_gate=gate).verify(
        InstanceView("s", 1, 1.0), REQUEST, threading.Event()
    )
    assert not decision.ok and decision.code == "not-warm" and "300 ms" in decision.reason


def test_verify_fails_when_health_never_answers(spawn, tmp_path):
    sup = Supervised(spawn, tmp_path, SLEEPER)
    with HttpRecorder() as server:
        server.respond("/healthz", 503, {"status": "warming"})
        decision = Verifier(
            sup.locate, timeout=1.5, stable_for=0.1, health_url=server.url + "/healthz"
        ).verify(InstanceView("s", 1, 1.0), REQUEST, threading.Event())
    assert not decision.ok and decision.code == "unhealthy" and "HTTP 503" in decision.reason


def test_drain_http_then_settle_and_failure_stops_the_restart():
    with HttpRecorder() as server:
        server.respond("/drain", 200, {})
        started = time.monotonic()
        ok = Drain(DrainSection(http=server.url + "/drain", settle=0.3)).run(
            InstanceView("s", 1, 1.0), REQUEST, threading.Event()
        )
        assert ok.ok and time.monotonic() - started >= 0.3
        server.respond("/drain", 500, {"error": "lb down"})
        failed = Drain(DrainSection(http=server.url + "/drain")).run(
            InstanceView("s", 1, 1.0), REQUEST, threading.Event()
        )
        assert not failed.ok and "not restarting" in failed.reason


def test_drain_command_failure_stops_the_restart():
    decision = Drain(DrainSection(command=[PYTHON, "-c", "raise SystemExit(2)"])).run(
        InstanceView("s", 1, 1.0), REQUEST, threading.Event()
    )
    assert not decision.ok and "status 2" in decision.reason
