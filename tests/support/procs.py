"""Real child processes for the tests: start them in their own session, wait for their `ready` line with a
real deadline, always reap them; and the small waits and ports that go with them."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable  # the real interpreter, not a pyenv shim

SpawnFn = Callable[..., subprocess.Popen]

# A wait's `timeout` is how long its event takes on a quiet host at most; the suite runs four workers on
# two cores beside whatever else the machine does, so every wait allows PATIENCE times that. A wait that
# is met returns at once: this only decides how long a failing test takes to say so.
PATIENCE = float(os.environ.get("MEDIC_TEST_PATIENCE", "3"))
# a restart's verification (`verify.timeout`): a new Python workload comes up and stays up within 20 s
VERIFY_TIMEOUT = f"{20 * PATIENCE:g}s"


def reap(proc: subprocess.Popen) -> None:
    """Kill the child (its whole session when it leads one), wait for it and close its pipes."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL) if _own_group(proc) else proc.kill()
        except ProcessLookupError:
            pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    for stream in (proc.stdout, proc.stderr, proc.stdin):
        if stream:
            stream.close()


def _own_group(proc: subprocess.Popen) -> bool:
    try:
        return os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:
        return False


def wait_ready(proc: subprocess.Popen, timeout: float = 10.0 * PATIENCE) -> list[str]:
    """The words of the child's first stdout line, which must start with `ready`.

    Reads the pipe byte by byte under `select`, so a child that prints nothing fails after `timeout`
    (with its exit status and what it printed) instead of blocking the suite, and nothing after the
    line is taken from the stream the test goes on reading."""
    assert proc.stdout is not None, "wait_ready needs stdout=subprocess.PIPE"
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    out = bytearray()
    while not out.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 1)
        if not chunk:  # end of file: the child closed stdout or exited
            break
        out += chunk
    line = out.decode(errors="replace")
    if not line.startswith("ready") or not line.endswith("\n"):
        try:
            proc.wait(timeout=0.5)  # a child that closed its stdout is usually exiting: show its status
        except subprocess.TimeoutExpired:
            pass
        raise AssertionError(
            f"{proc.args!r} printed no `ready` line within {timeout}s: "
            f"printed {line!r}, exit status {proc.poll()}"
        )
    return line.split()


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05) -> object:
    """Poll `predicate` until it returns something truthy; raise AssertionError after PATIENCE x `timeout`."""
    allowed = timeout * PATIENCE
    deadline = time.monotonic() + allowed
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {allowed:g}s")
        time.sleep(interval)


def free_port() -> int:
    """A free TCP port on loopback (for servers started by tests)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def workload_argv(mode: str, *args: str) -> list[str]:
    """The argv of a sample workload (`agent.demo.workload`), for `command:` instances."""
    return [PYTHON, "-m", "agent.demo.workload", mode, *args]
