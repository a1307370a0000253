"""Managed processes: commands medic launches itself (`medic run -- CMD`, or `command:` in config).

medic starts the child in its own session (so a terminal's Ctrl-C reaches it once, through
medic), relaunches it when it exits if asked, with an exponential back-off so that a
crash-looping command does not spin, and stops it with TERM then KILL. The running child is
held by a pidfd from launch on, and every signal goes through it. A child that outlived an
agent killed with -9 is adopted by the next agent (`adopt`): watched through its pidfd, stopped
like any other, relaunched when it ends; only its exit status is unknown (it is not our child).

Every start and every end is recorded as a `Run` (pid, when it started, when it ended, how), all of
them, also those that start and die between two reconciles: the tracker stores them and crash
loops are judged from these real uptimes. A relaunch can be held (`hold`): an escalated instance is
not relaunched until a person clears it. A child's stdout and stderr go to its own log file (0600,
`log_path`), kept under `LOG_MAX_BYTES` by copy-truncate (the child appends, so it never notices),
with one older generation as `<log>.1`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.core.errors import ProbeError
from probes.linux.pidfd import Expected, IdentityChanged, Pinned, Verdict, pin
from probes.linux.procfs import process_identity

log = logging.getLogger("medic.supervisor")

_MIN_BACKOFF = 1.0
_MAX_BACKOFF = 300.0
_HEALTHY_AFTER = 60.0  # a child that lived this long resets the back-off
LOG_MAX_BYTES = 16 * 2**20


@dataclass(frozen=True, slots=True)
class Run:
    """One process of a managed command: `ended_at` None while it runs; `exit_status` shell-style,
    None when unknown (adopted)."""

    pid: int
    started_at: float
    ended_at: float | None = None
    exit_status: int | None = None


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
    proc: subprocess.Popen[bytes] | None = None
    started_at: float | None = None
    exit_code: int | None = None
    launches: int = 0
    next_launch_at: float = 0.0
    backoff: float = _MIN_BACKOFF
    stopping: bool = False
    pinned: Pinned | None = None  # the running child, held by a pidfd: signals reach it and nothing else
    adopted: bool = False  # the child was launched by an earlier agent and is watched, not waited for
    ended: bool = False  # the current child has ended and `poll_exit` reported it
    held: str | None = None  # why relaunches are held (an escalation); None: relaunch as configured
    log_path: Path | None = None  # the child's stdout and stderr; None: inherited (`medic run -- CMD`)
    runs: list[Run] = field(default_factory=list)  # starts and ends not yet taken by the tracker
    run_pid: int | None = None  # the pid of the current Run

    def launch(self) -> int:
        """Start the command; returns its pid. Raises OSError when it cannot be executed."""
        env = {**os.environ, **self.env}
        self._release()
        output = self._open_log()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=self.cwd,
                env=env,
                start_new_session=True,
                stdin=subprocess.DEVNULL if output is not None else None,
                stdout=output,
                stderr=subprocess.STDOUT if output is not None else None,
            )
        finally:
            if output is not None:
                os.close(output)
        self.started_at = time.time()
        self.run_pid = self.proc.pid
        self.runs.append(Run(self.proc.pid, self.started_at))
        self.exit_code = None
        self.ended = False
        self.adopted = False
        self.launches += 1
        try:  # our unreaped child: its pid cannot be reused, so pinning it now is exact
            self.pinned = pin(Expected(self.proc.pid, process_identity(self.proc.pid).start_time))
        except ProbeError:
            self.pinned = None  # it already exited; poll_exit reports it
        logged = f" (output: {self.log_path})" if self.log_path is not None else ""
        log.info("launched %s: pid %d%s: %s", self.name, self.proc.pid, logged, " ".join(self.argv))
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
        self.run_pid = expected.pid
        self.runs.append(Run(expected.pid, expected.start_time))
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
        self._ended(end.code)
        lived = time.time() - (self.started_at or time.time())
        self.backoff = _MIN_BACKOFF if lived >= _HEALTHY_AFTER else min(self.backoff * 2, _MAX_BACKOFF)
        self.next_launch_at = time.time() + self.backoff
        return end

    def _ended(self, code: int | None) -> None:
        if self.run_pid is not None and self.started_at is not None:
            status = None if code is None else exit_status(code)
            self.runs.append(Run(self.run_pid, self.started_at, time.time(), status))
        self.run_pid = None

    def take_runs(self) -> list[Run]:
        """The starts and ends recorded since the last call, oldest first."""
        runs, self.runs = self.runs, []
        return runs

    def due_for_relaunch(self, now: float) -> bool:
        return (
            self.restart_on_exit
            and not self.stopping
            and self.held is None
            and self.ended
            and now >= self.next_launch_at
        )

    # ----------------------------------------------------------------------------- the log file
    def _open_log(self) -> int | None:
        """The log file, opened for appending (0600, never through a symlink); None: inherit medic's."""
        if self.log_path is None:
            return None
        self.log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(
            self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        os.fchmod(fd, 0o600)
        return fd

    def bound_log(self, limit: int = LOG_MAX_BYTES) -> None:
        """Keep the log under `limit`: copy it to `<log>.1`, then truncate it in place (copy-truncate:
        the child keeps its descriptor and, appending, writes at the new end)."""
        path = self.log_path
        if path is None:
            return
        try:
            if os.lstat(path).st_size <= limit:
                return
            old = path.with_name(path.name + ".1")
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(old)
                out = os.open(old, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                try:
                    os.lseek(fd, max(0, os.fstat(fd).st_size - limit), os.SEEK_SET)
                    while chunk := os.read(fd, 1 << 20):
                        os.write(out, chunk)
                finally:
                    os.close(out)
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("cannot bound the log of %s (%s): %s", self.name, path, exc.strerror or exc)

    def send(self, sig: int) -> None:
        """Forward a signal to the child (not to its whole session: it may have its own children)."""
        if self.pinned is not None:
            self.pinned.send(sig)

    def restart(self, timeout: float | None = None) -> int:
        """Stop the child (TERM, then KILL after `timeout`) and launch it again; returns the new pid.

        While it runs, the tracker does not relaunch on its own (`stopping`, cleared only once the new
        process is launched: cleared between the stop and the launch, a tracker running then saw an
        ended child free to relaunch, and two processes started), so exactly one new process starts."""
        self.stop(timeout)
        self.exit_code = None
        self.backoff = _MIN_BACKOFF
        try:
            return self.launch()
        finally:
            self.stopping = False  # a launch that failed is the tracker's to retry, with its back-off

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
            if not self.ended:
                self._ended(None)
            self.ended = True
            return None
        code = self.proc.wait()
        if not self.ended:
            self._ended(code)
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


def relaunch_warnings(
    specs: Iterable[Any], window: float, reset_after: float, max_restarts: int, compressed: bool = False
) -> list[str]:
    """What `medic config check` warns about the supervisor's relaunches against the crash-loop rule:
    a back-off that can exceed `reset_after` (a crash loop is still counted from real uptimes, but
    the gaps no longer tell it), and one that spreads `max_restarts` crashes beyond `window` (then the
    loop is never found). On a `compressed` time axis the back-off, real time that spares the host,
    always outlasts the compressed `reset_after`: only the second is said."""
    managed = [s.name for s in specs if s.match.managed and s.restart_on_exit]
    if not managed:
        return []
    names = ", ".join(managed[:5]) + ("…" if len(managed) > 5 else "")
    found = []
    if reset_after < _MAX_BACKOFF and not compressed:
        found.append(
            f"remediation.ladder.crash_loop.reset_after ({reset_after:g}s) is shorter than the relaunch "
            f"back-off of managed instances ({names}), which grows to {_MAX_BACKOFF:g}s: crash loops are "
            f"counted from each process's real uptime, so they are still found, but set reset_after to at "
            f"least {_MAX_BACKOFF:g}s so that a quiet gap is never taken for a process that stayed up"
        )
    spread = sum(min(_MIN_BACKOFF * 2**i, _MAX_BACKOFF) for i in range(max(0, max_restarts - 1)))
    if spread > window:
        found.append(
            f"remediation.ladder.crash_loop: {max_restarts} crashes of {names} take at least {spread:g}s with "
            f"the relaunch back-off, longer than window ({window:g}s): that crash loop is never found; "
            "lengthen the window or lower max_restarts"
        )
    return found
