"""Signal a process only while it is still the process medic means.

A pid names a process only until it exits: the kernel hands the number to the next fork. What
medic means by "this process" is an `Expected` identity: the pid, its start time, and what the
instance matched when the process was adopted (the program's path, the command line, for a
managed child that it leads its own session). Every signal medic sends to a target goes through
`pin`, which opens a pidfd first and only then reads /proc, so the process that was checked is
the one that receives the signal: a pid freed and reused in between makes the pidfd refer to a
dead process, never to the newcomer.

    with pin(expected) as pinned:        # raises IdentityChanged with the reason
        pinned.send(signal.SIGTERM)
        pinned.wait_exit(10.0)

`check(expected)` is the same verification without pinning; `signal_if_same` the one-shot form.
Without pidfd support (kernel < 5.3) the check runs right before `kill`, which narrows the race
but cannot close it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from agent.core.errors import ProbeError
from probes.linux.procfs import HOST_ROOT, read_cmdline, read_exe, read_stat, same_process, start_time


@dataclass(frozen=True, slots=True)
class Expected:
    """The identity a process must still have: pid + start time, and what was matched at adoption
    (None: not checked)."""

    pid: int
    start_time: float
    exe: str | None = None
    cmdline: tuple[str, ...] | None = None
    session_leader: bool = False  # a managed child runs in a session of its own


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome of an identity check: `reason` is `same`, `gone`, `pid-reused`,
    `exe-mismatch`, `cmdline-mismatch` or `not-session-leader`."""

    reason: str
    message: str

    @property
    def ok(self) -> bool:
        return self.reason == "same"


class IdentityChanged(ProbeError):
    """The pid no longer belongs to the expected process; nothing was signalled."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict.message)
        self.verdict = verdict


def check(expected: Expected, root: Path = HOST_ROOT) -> Verdict:
    """Does `expected.pid` still run the expected process? Reads /proc/PID/stat, exe and cmdline."""
    pid = expected.pid
    try:
        stat = read_stat(pid, root)
    except ProbeError as exc:
        return Verdict("gone", f"pid {pid} is gone: {exc}")
    if stat.state in ("Z", "X"):
        return Verdict("gone", f"pid {pid} has exited")
    actual = start_time(stat, root)
    if not same_process(actual, expected.start_time):
        return Verdict(
            "pid-reused",
            f"pid {pid} now belongs to another process ({stat.comm!r}, started {actual:.2f}, "
            f"expected {expected.start_time:.2f})",
        )
    if expected.session_leader and stat.session != pid:
        return Verdict("not-session-leader", f"pid {pid} does not lead its own session: not medic's child")
    try:
        if expected.exe is not None:
            exe = read_exe(pid, root)
            if exe is not None and exe != expected.exe:
                return Verdict("exe-mismatch", f"pid {pid} runs {exe!r}, not {expected.exe!r}")
        if expected.cmdline is not None:
            cmdline = tuple(read_cmdline(pid, root))
            if cmdline != tuple(expected.cmdline):
                return Verdict(
                    "cmdline-mismatch",
                    f"pid {pid} runs {' '.join(cmdline)[:120]!r}, not {' '.join(expected.cmdline)[:120]!r}",
                )
    except ProbeError as exc:
        return Verdict("gone", f"pid {pid} is gone: {exc}")
    return Verdict("same", f"pid {pid} is the expected process")


class Pinned:
    """A verified process held by a pidfd: signals and the exit wait refer to it and nothing else."""

    def __init__(self, expected: Expected, fd: int | None) -> None:
        self.expected = expected
        self.fd = fd  # None: no pidfd support, signals go through kill() after a fresh check

    def send(self, sig: int) -> bool:
        """Send `sig`; False when the process has already exited (nothing was sent)."""
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
                return True
            if not check(self.expected).ok:
                return False
            os.kill(self.expected.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def exited(self) -> bool:
        return self.wait_exit(0.0)

    def wait_exit(self, timeout: float) -> bool:
        """True once the process has exited (its pidfd turns readable), within `timeout` seconds."""
        if self.fd is not None:
            poller = select.poll()
            poller.register(self.fd, select.POLLIN)
            return bool(poller.poll(max(0.0, timeout) * 1000))
        deadline = time.monotonic() + timeout
        while True:
            if check(self.expected).reason in ("gone", "pid-reused"):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def close(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None

    def __enter__(self) -> Pinned:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_pidfd(pid: int) -> int | None:
    """A pidfd for `pid`; None without kernel support. `ProcessLookupError` when no such pid."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, NotImplementedError):
        return None
    except OSError as exc:
        if isinstance(exc, ProcessLookupError):
            raise
        if exc.errno in (38, 1):  # ENOSYS (old kernel), EPERM (seccomp profile without pidfd_open)
            return None
        raise


def pin(expected: Expected, root: Path = HOST_ROOT) -> Pinned:
    """Pin `expected.pid` with a pidfd, then verify it; `IdentityChanged` when it is not the process."""
    try:
        fd = open_pidfd(expected.pid)
    except ProcessLookupError:
        raise IdentityChanged(Verdict("gone", f"pid {expected.pid} is gone")) from None
    verdict = check(expected, root)  # after the pidfd: the checked process is the pinned one
    if not verdict.ok:
        if fd is not None:
            os.close(fd)
        raise IdentityChanged(verdict)
    return Pinned(expected, fd)


def signal_if_same(expected: Expected, sig: int, root: Path = HOST_ROOT) -> Verdict:
    """Send `sig` to the process only if it is still `expected`; the verdict says what happened."""
    try:
        with pin(expected, root) as pinned:
            if not pinned.send(sig):
                return Verdict("gone", f"pid {expected.pid} exited before it was signalled")
    except IdentityChanged as exc:
        return exc.verdict
    return Verdict("same", f"sent {signal.Signals(sig).name} to pid {expected.pid}")
