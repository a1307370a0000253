"""Managed processes: commands medic launches itself (`medic run -- CMD`, or `command:` in config).

medic starts the child in its own session (so a terminal's Ctrl-C reaches it once, through
medic), relaunches it when it exits if asked, with an exponential back-off so that a
crash-looping command does not spin, and stops it with TERM then KILL.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("medic.supervisor")

_MIN_BACKOFF = 1.0
_MAX_BACKOFF = 300.0
_HEALTHY_AFTER = 60.0  # a child that lived this long resets the back-off


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

    def launch(self) -> int:
        """Start the command; returns its pid. Raises OSError when it cannot be executed."""
        env = {**os.environ, **self.env}
        self.proc = subprocess.Popen(self.argv, cwd=self.cwd, env=env, start_new_session=True)
        self.started_at = time.time()
        self.exit_code = None
        self.launches += 1
        log.info("launched %s: pid %d: %s", self.name, self.proc.pid, " ".join(self.argv))
        return self.proc.pid

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    def poll_exit(self) -> int | None:
        """The exit code if the child ended since the last call (once), else None."""
        if self.proc is None or self.exit_code is not None:
            return None
        code = self.proc.poll()
        if code is None:
            return None
        self.exit_code = code
        lived = time.time() - (self.started_at or time.time())
        self.backoff = _MIN_BACKOFF if lived >= _HEALTHY_AFTER else min(self.backoff * 2, _MAX_BACKOFF)
        self.next_launch_at = time.time() + self.backoff
        return code

    def due_for_relaunch(self, now: float) -> bool:
        return (
            self.restart_on_exit
            and not self.stopping
            and self.exit_code is not None
            and now >= self.next_launch_at
        )

    def send(self, sig: int) -> None:
        """Forward a signal to the child (not to its whole session: it may have its own children)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)

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
        """TERM, wait up to `timeout` (default stop_timeout), then KILL; returns the exit code."""
        self.stopping = True
        if self.proc is None:
            return None
        timeout = self.stop_timeout if timeout is None else timeout
        self.send(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop within %.1fs of SIGTERM; sending SIGKILL", self.name, timeout)
            self.proc.kill()
            return self.proc.wait()


def exit_status(code: int) -> int:
    """A shell-style exit status: a child killed by signal N gives 128 + N."""
    return 128 - code if code < 0 else code
