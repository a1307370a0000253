"""`signal` actuator: TERM, a grace period, KILL; something else (a supervisor) starts the new process.

It never signals a process that is not the instance: before anything is sent, the pid's start time
(and its command line, when known) must match what the engine saw. The process is then pinned
with a pidfd (`pidfd_open`), re-checked, and every signal goes through that pidfd, so a pid that
is freed and reused while medic waits can never receive the KILL. Success means the old process
is gone and a new one (found by the runtime's `locate`) is up.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time

from agent.errors import ProbeError
from agent.records import ProcessIdentity
from probes.linux.procfs import read_cmdline, read_stat, same_process, start_time
from remediation.actuators.base import STAGE, Locator
from remediation.model import Decision, InstanceView, RemediationRequest

_POLL = 0.05


def check_identity(view: InstanceView, stage: str = STAGE) -> Decision:
    """Is `view.pid` still the process the engine means (start time, and cmdline when known)?"""
    if view.pid is None or view.start_time is None:
        return Decision.block(stage, "no-process", f"{view.name} has no known process to signal")
    try:
        stat = read_stat(view.pid)
    except ProbeError as exc:
        return Decision.block(stage, "gone", f"pid {view.pid} of {view.name} is gone: {exc}")
    if stat.state in ("Z", "X"):
        return Decision.block(stage, "gone", f"pid {view.pid} of {view.name} has already exited")
    actual_start = start_time(stat)
    if not same_process(actual_start, view.start_time):
        return Decision.block(
            stage,
            "pid-reused",
            f"pid {view.pid} now belongs to another process ({stat.comm!r}, started {actual_start:.2f}, "
            f"expected {view.start_time:.2f}); not signalled",
        )
    if view.cmdline:
        try:
            cmdline = tuple(read_cmdline(view.pid))
        except ProbeError as exc:
            return Decision.block(stage, "gone", f"pid {view.pid} of {view.name} is gone: {exc}")
        if cmdline != tuple(view.cmdline):
            return Decision.block(
                stage,
                "cmdline-mismatch",
                f"pid {view.pid} runs {' '.join(cmdline)[:120]!r}, not {' '.join(view.cmdline)[:120]!r}; "
                "not signalled",
            )
    return Decision.allow(stage, f"pid {view.pid} is {view.name}")


class SignalActuator:
    kind = "signal"

    def __init__(
        self,
        locate: Locator,
        *,
        sig: int = signal.SIGTERM,
        grace: float = 30.0,
        kill: bool = True,
        start_timeout: float = 120.0,
    ) -> None:
        self.locate = locate
        self.sig = signal.Signals(sig)
        self.grace = grace
        self.kill = kill
        self.start_timeout = start_timeout

    def restart(self, view: InstanceView, request: RemediationRequest | None, timeout: float) -> Decision:
        identity = check_identity(view)
        if not identity.ok:
            return identity
        try:
            pidfd = os.pidfd_open(view.pid)  # type: ignore[arg-type]
        except ProcessLookupError:
            return Decision.block(
                STAGE, "gone", f"pid {view.pid} of {view.name} exited before it was signalled"
            )
        try:
            pinned = check_identity(view)  # the pidfd now pins whatever had the pid: make sure it is ours
            if not pinned.ok:
                return pinned
            started = time.monotonic()
            signal.pidfd_send_signal(pidfd, self.sig)
            how = self.sig.name
            if not _wait_exit(pidfd, self.grace):
                if not self.kill:
                    return Decision.block(
                        STAGE,
                        "still-running",
                        f"{view.name} (pid {view.pid}) ignored {how} for {self.grace:g}s and kill is off",
                    )
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                how += f", then KILL after {self.grace:g}s"
                if not _wait_exit(pidfd, 10.0):
                    return Decision.block(STAGE, "unkillable", f"{view.name} (pid {view.pid}) survived KILL")
            stopped_after = time.monotonic() - started
        finally:
            os.close(pidfd)
        new = self._wait_new_process(view, min(self.start_timeout, max(timeout - stopped_after, 1.0)))
        if new is None:
            return Decision.block(
                STAGE,
                "not-restarted",
                f"{view.name} stopped ({how}) but no new process appeared within {self.start_timeout:g}s; "
                "is a supervisor (systemd, Kubernetes, medic run) bringing it back?",
                signal=how,
            )
        return Decision.allow(
            STAGE,
            f"sent {how}; pid {view.pid} exited after {stopped_after:.1f}s; new pid {new.pid}",
            signal=how,
            new_pid=new.pid,
            new_start_time=new.start_time,
        )

    def _wait_new_process(self, view: InstanceView, timeout: float) -> ProcessIdentity | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            current = self.locate(view.name)
            if current is not None and not (
                current.pid == view.pid and same_process(current.start_time, view.start_time or 0.0)
            ):
                return current
            time.sleep(0.1)
        return None


def _wait_exit(pidfd: int, timeout: float) -> bool:
    """True once the pinned process has exited (its pidfd becomes readable)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout) * 1000))
