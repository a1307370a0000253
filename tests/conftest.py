"""Shared fixtures: real child processes that are always reaped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable  # the real interpreter, not a pyenv shim


def _reap(proc: subprocess.Popen) -> None:
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


SpawnFn = Callable[..., subprocess.Popen]


@pytest.fixture
def spawn() -> Iterator[SpawnFn]:
    """Start a real child (`spawn(argv, **popen_kwargs)`); every child is killed and reaped at teardown."""
    children: list[subprocess.Popen] = []

    def _spawn(argv: list[str], **kwargs) -> subprocess.Popen:
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(argv, **kwargs)
        children.append(proc)
        return proc

    yield _spawn
    for proc in children:
        _reap(proc)


@pytest.fixture
def workload(spawn: SpawnFn) -> Callable[..., subprocess.Popen]:
    """Start `agent.sample_workload MODE ARGS...` and wait for its `ready` line (10 s at most)."""

    def _workload(mode: str, *args: str, **kwargs) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(REPO), **kwargs.pop("env", {})}
        proc = spawn(
            [PYTHON, "-m", "agent.sample_workload", mode, *args],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            **kwargs,
        )
        wait_ready(proc)
        return proc

    return _workload


def wait_ready(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Block until the child prints its `ready` line; fail with its exit status otherwise."""
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line.startswith("ready") or time.monotonic() > deadline:
        raise AssertionError(f"workload did not become ready: {line!r}, exit={proc.poll()}")


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05) -> object:
    """Poll `predicate` until it returns something truthy; raise AssertionError after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)
