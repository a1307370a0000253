"""Managed processes: commands medic launches itself (`medic run -- CMD`, or `command:` in config).

medic starts the child in its own session (so a terminal's Ctrl-C reaches it once, through
medic), relaunches it when it exits if asked, with an exponential back-off so that a
crash-looping command does not spin, and stops it with TERM then KILL. The running child is
held by a pidfd from launch on, and every signal goes through it. A child that outlived an
agent killed with -9 is adopted by the next agent (`adopt`): watched through its pidfd, stopped
like any other, relaunched when it ends; only its exit status is unknown (it is not our child).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.core.errors import ProbeError
from probes.linux.pidfd import Expected, IdentityChanged, Pinned, Verdict, pin
from probes.linux.procfs import process_identity

log = logging.getLogger("medic.supervisor")

_MIN_BACKOFF = 1.0
_MAX_BACKOFF = 300.0
_HEALTHY_AFTER = 60.0  # a child that lived this long resets the back-off


@dataclass(frozen=True, slots=True)
class Exit:
    """How a managed child ended: `code` as Popen gives it, None when medic could not wait for it
    (a child adopted from an earlier agent is not medic's child: only its end is seen)."""

    code: int | None


@dataclass
class ManagedProcess:
    name: str
    argv: list[str]
    cwd: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    restart_on_exit: bool = True
    stop_timeout: float = 5.0
    proc: subprocess.Popen | None = None
    started_at: float | None = None
    exit_code: int | None = None
    launches: int = 0
    next_launch_at: float = 0.0
    backoff: float = _MIN_BACKOFF
    stopping: bool = False
    pinned: Pinned | None = None  # the running child, held by a pidfd: signals reach it and nothing else
    adopted: bool = False  # the child was launched by an earlier agent and is watched, not waited for
    ended: bool = False  # the current child has ended and `poll_exit` reported it

    def launch(self) -> int:
        """Start the command; returns its pid. Raises OSError when it cannot be executed."""
        env = {**os.environ, **self.env}
        self._release()
        self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=env, start_new_session=True)
        self.started_at = time.time()
        self.exit_code = None
        self.ended = False
        self.adopted = False
        self.launches += 1
        try:  # our unreaped child: its pid cannot be reused, so pinning it now is exact
            self.pinned = pin(Expected(self.proc.pid, process_identity(self.proc.pid).start_time))
        except ProbeError:
            self.pinned = None  # it already exited; poll_exit reports it
        log.info("launched %s: pid %d: %s", self.name, self.proc.pid, " ".join(self.argv))
        return self.proc.pid

    def adopt(self, expected: Expected) -> Verdict:
        """Watch a child an earlier agent launched (it outlived that agent) instead of launching a copy."""
        try:
            pinned = pin(expected)
        except IdentityChanged as exc:
            return exc.verdict
        self._release()
        self.proc, self.pinned, self.adopted, self.ended = None, pinned, True, False
        self.started_at, self.exit_code = expected.start_time, None
        log.info("adopted %s: pid %d, launched by an earlier medic", self.name, expected.pid)
        return Verdict("same", f"pid {expected.pid} still runs")

    @property
    def identity(self) -> Expected | None:
        """The running child's identity (pid and start time), None when none runs."""
        return self.pinned.expected if self.pinned is not None and self.pid is not None else None

    @property
    def pid(self) -> int | None:
        if self.adopted:
            pinned = self.pinned
            return pinned.expected.pid if pinned is not None and not pinned.exited() else None
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    def poll_exit(self) -> Exit | None:
        """How the child ended, if it ended since the last call (reported once), else None."""
        if self.ended or (self.proc is None and not self.adopted):
            return None
        if self.adopted:
            if self.pinned is not None and not self.pinned.exited():
                return None
            end = Exit(None)
        else:
            code = self.proc.poll()  # type: ignore[union-attr]
            if code is None:
                return None
            self.exit_code = code
            end = Exit(code)
        self.ended = True
        self._release()
        lived = time.time() - (self.started_at or time.time())
        self.backoff = _MIN_BACKOFF if lived >= _HEALTHY_AFTER else min(self.backoff * 2, _MAX_BACKOFF)
        self.next_launch_at = time.time() + self.backoff
        return end

    def due_for_relaunch(self, now: float) -> bool:
        return self.restart_on_exit and not self.stopping and self.ended and now >= self.next_launch_at

    def send(self, sig: int) -> None:
        """Forward a signal to the child (not to its whole session: it may have its own children)."""
        if self.pinned is not None:
            self.pinned.send(sig)

    def restart(self, timeout: float | None = None) -> int:
        """Stop the child (TERM, then KILL after `timeout`) and launch it again; returns the new pid.

        While it runs, the tracker does not relaunch on its own (`stopping`), so exactly one new
        process starts."""
        self.stop(timeout)
        self.stopping = False
        self.exit_code = None
        self.backoff = _MIN_BACKOFF
        return self.launch()

    def stop(self, timeout: float | None = None) -> int | None:
        """TERM, wait up to `timeout` (default stop_timeout), then KILL; returns the exit code
        (None for an adopted child, whose status only its real parent sees)."""
        self.stopping = True
        timeout = self.stop_timeout if timeout is None else timeout
        pinned = self.pinned
        if pinned is not None and not pinned.exited():
            pinned.send(signal.SIGTERM)
            if not pinned.wait_exit(timeout):
                log.warning("%s did not stop within %.1fs of SIGTERM; sending SIGKILL", self.name, timeout)
                pinned.send(signal.SIGKILL)
                pinned.wait_exit(10.0)
        if self.adopted or self.proc is None:
            self._release()
            self.ended = True
            return None
        code = self.proc.wait()
        self.exit_code, self.ended = code, True
        self._release()
        return code

    def _release(self) -> None:
        if self.pinned is not None:
            self.pinned.close()
            self.pinned = None


def exit_status(code: int) -> int:
    """A shell-style exit status: a child killed by signal N gives 128 + N."""
    return 128 - code if code < 0 else code
