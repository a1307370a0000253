"""Shared fixtures: real child processes that are always reaped, real agents, private socket dirs and
webhook targets. The code behind them is in `support/`."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from support.agent_runner import AgentRunner
from support.notify import HookServer
from support.procs import PYTHON, REPO, SpawnFn, reap, wait_ready

# Property tests judge behaviour, not speed: on a shared CI machine a per-example deadline only
# turns load into failures (speed is measured in benchmarks/).
settings.register_profile("medic", deadline=None)
settings.load_profile("medic")


@pytest.fixture
def spawn() -> Iterator[SpawnFn]:
    """Start a real child (`spawn(argv, **popen_kwargs)`); every child is killed and reaped at teardown."""
    children: list[subprocess.Popen] = []

    def _spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen:
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(argv, **kwargs)
        children.append(proc)
        return proc

    yield _spawn
    for proc in children:
        reap(proc)


@pytest.fixture
def workload(spawn: SpawnFn) -> Callable[..., subprocess.Popen]:
    """Start `agent.demo.workload MODE ARGS...` and wait for its `ready` line (10 s at most)."""

    def _workload(mode: str, *args: str, **kwargs: Any) -> subprocess.Popen:
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


@pytest.fixture
def agent(spawn: SpawnFn, tmp_path: Path) -> Iterator[AgentRunner]:
    """Start real agents with `agent.start(config_dict)`; at teardown they are stopped, their
    children killed, and everything reaped."""
    runner = AgentRunner(spawn, tmp_path)
    yield runner
    runner.close()


@pytest.fixture
def sock_dir() -> Iterator[str]:
    """A short private directory under /tmp: Unix socket paths are limited to 107 bytes, and pytest's
    tmp_path is longer than that allows."""
    path = tempfile.mkdtemp(prefix="medic-s-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def hook_server() -> Iterator[Callable[..., HookServer]]:
    """`hook_server(**kwargs)` starts a webhook target (`support.notify.HookServer`); all are stopped
    at teardown."""
    servers: list[HookServer] = []

    def make(**kwargs: Any) -> HookServer:
        server = HookServer(**kwargs).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


CPU_ROOT = Path("/sys/fs/cgroup/cpu")  # cgroup v1 cpu controller (REFERENCE §5.3)


@pytest.fixture
def cpu_quota() -> Iterator[Callable[[int, float], None]]:
    """`cpu_quota(pid, cores)`: put a process in a fresh v1 cpu cgroup with that CFS quota; undone at teardown."""
    if os.geteuid() != 0 or not (CPU_ROOT / "cpu.cfs_quota_us").exists():
        pytest.skip("needs root and the cgroup v1 cpu controller")
    made: list[Path] = []

    def limit(pid: int, cores: float) -> None:
        group = CPU_ROOT / f"medic-test-{os.getpid()}-{len(made)}"
        group.mkdir()
        made.append(group)
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text(str(int(cores * 100000)))
        (group / "cgroup.procs").write_text(str(pid))

    yield limit
    for group in made:
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                (CPU_ROOT / "cgroup.procs").write_text(pid)  # back to the root cgroup
            except OSError:
                pass  # it exited meanwhile
        group.rmdir()
