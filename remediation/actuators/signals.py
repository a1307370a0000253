"""`signal` actuator: TERM, a grace period, KILL; something else (a supervisor) starts the new process.

It never signals a process that is not the instance: before anything is sent, the pid's start time
(and its command line, when known) must match what the engine saw. The process is then pinned
with a pidfd (`probes.linux.pidfd.pin`: open the pidfd, then check), and every signal goes through
that pidfd, so a pid that is freed and reused while medic waits can never receive the KILL.
Success means the old process is gone and a new one (found by the runtime's `locate`) is up.
"""

from __future__ import annotations

import signal
import time

from agent.core.records import ProcessIdentity
from probes.linux.pidfd import Expected, IdentityChanged, Verdict, check, pin
from probes.linux.procfs import same_process
from remediation.actuators.base import STAGE, Locator
from remediation.model import Decision, InstanceView, RemediationRequest


def expected_of(view: InstanceView) -> Expected | None:
    """The identity the engine saw for `view` (start time, and cmdline when known)."""
    if view.pid is None or view.start_time is None:
        return None
    return Expected(view.pid, view.start_time, cmdline=tuple(view.cmdline) if view.cmdline else None)


def _blocked(view: InstanceView, verdict: Verdict, stage: str) -> Decision:
    return Decision.block(stage, verdict.reason, f"{view.name}: {verdict.message}; not signalled")


def check_identity(view: InstanceView, stage: str = STAGE) -> Decision:
    """Is `view.pid` still the process the engine means (start time, and cmdline when known)?"""
    expected = expected_of(view)
    if expected is None:
        return Decision.block(stage, "no-process", f"{view.name} has no known process to signal")
    verdict = check(expected)
    if not verdict.ok:
        return _blocked(view, verdict, stage)
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
        expected = expected_of(view)
        if expected is None:
            return Decision.block(STAGE, "no-process", f"{view.name} has no known process to signal")
        try:
            pinned = pin(expected)  # pidfd first, then the identity check: the checked one is signalled
        except IdentityChanged as exc:
            return _blocked(view, exc.verdict, STAGE)
        with pinned:
            started = time.monotonic()
            how = self.sig.name
            if not pinned.send(self.sig):
                return Decision.block(
                    STAGE, "gone", f"pid {view.pid} of {view.name} exited before it was signalled"
                )
            if not pinned.wait_exit(self.grace):
                if not self.kill:
                    return Decision.block(
                        STAGE,
                        "still-running",
                        f"{view.name} (pid {view.pid}) ignored {how} for {self.grace:g}s and kill is off",
                    )
                pinned.send(signal.SIGKILL)
                how += f", then KILL after {self.grace:g}s"
                if not pinned.wait_exit(10.0):
                    return Decision.block(STAGE, "unkillable", f"{view.name} (pid {view.pid}) survived KILL")
            stopped_after = time.monotonic() - started
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
