"""Shared fixtures: real child processes that are always reaped."""

from __future__ import annotations

import os
import signal
import socket
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
    """Start `agent.demo.workload MODE ARGS...` and wait for its `ready` line (10 s at most)."""

    def _workload(mode: str, *args: str, **kwargs) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(REPO), **kwargs.pop("env", {})}
        proc = spawn(
            [PYTHON, "-m", "agent.demo.workload", mode, *args],
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


def free_port() -> int:
    """A free TCP port on loopback (for servers started by tests)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


class AgentRunner:
    """A real `medic run` process on a free loopback port with its own state dir."""

    def __init__(self, spawn: SpawnFn, tmp_path: Path) -> None:
        self._spawn = spawn
        self.state_dir = tmp_path / "state"
        self.tmp_path = tmp_path
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.log = tmp_path / "agent.log"
        self._children: set = set()

    def start(
        self, config: dict, *extra_args: str, prefix: list[str] | None = None, wait: bool = True
    ) -> subprocess.Popen:
        import yaml

        config = {
            **config,
            "agent": {"listen": "127.0.0.1:0", "state_dir": str(self.state_dir), **config.get("agent", {})},
        }
        path = self.tmp_path / "medic.yaml"
        path.write_text(yaml.safe_dump(config))
        (self.state_dir / "agent.json").unlink(missing_ok=True)
        argv = [*(prefix or []), PYTHON, "-m", "agent.cli.main", "run", "--config", str(path), *extra_args]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = self._spawn(argv, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, env=env)
        if wait:
            self.wait_started()
        return self.proc

    def wait_started(self, timeout: float = 60.0) -> None:
        """Wait for agent.json and /healthz; generous: a cold first start compiles and imports everything."""
        import json

        info = self.state_dir / "agent.json"

        def started() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"agent exited with {self.proc.returncode}:\n{self.log.read_text()}")
            return info.exists()

        wait_until(started, timeout)
        self.url = json.loads(info.read_text())["url"]
        wait_until(lambda: self._healthy(), timeout)

    def _healthy(self) -> bool:
        import httpx

        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def get(self, path: str, **params):
        import httpx

        self._note_children()
        response = httpx.get(f"{self.url}{path}", params=params, timeout=5)
        response.raise_for_status()
        return response.json() if "json" in response.headers.get("content-type", "") else response.text

    def instance(self, name: str) -> dict:
        return self.get(f"/api/v1/instances/{name}")["instance"]

    def events(self, **params) -> list[dict]:
        return self.get("/api/v1/events", limit=1000, **params)["events"]

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        assert self.proc is not None
        self._note_children()
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def _note_children(self) -> None:
        """Remember the agent's children: managed instances run in sessions of their own, so
        killing the agent's process group at teardown would leave them running."""
        import psutil

        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self._children.update(psutil.Process(self.proc.pid).children(recursive=True))
        except psutil.Error:
            pass

    def close(self) -> None:
        """Stop the agent the way an operator would (it stops what it launched), then kill any
        child of it that is still running."""
        import psutil

        self._note_children()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for child in self._children:
            try:
                child.kill()  # psutil checks the start time: a reused pid is left alone
            except psutil.Error:
                pass


@pytest.fixture
def agent(spawn: SpawnFn, tmp_path: Path) -> Iterator[AgentRunner]:
    """Start real agents with `agent.start(config_dict)`; at teardown they are stopped, their
    children killed, and everything reaped."""
    runner = AgentRunner(spawn, tmp_path)
    yield runner
    runner.close()


def workload_argv(mode: str, *args: str) -> list[str]:
    """The argv of a sample workload, for `command:` instances."""
    return [PYTHON, "-m", "agent.demo.workload", mode, *args]
