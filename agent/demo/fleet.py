"""The running demo: the model, the agent process that launches and watches the servers, the load,
and a cleanup that leaves nothing behind.

`Fleet(settings, state_dir)` builds the model, writes the config of `agent.demo.config`, starts
`medic run` on it in its own session (the agent launches each server as a managed `command:`
instance, so the enforce-mode engine restarts them with the `managed` actuator), waits for its API
and the servers, then starts the load. `close()` stops the load, sends the agent SIGTERM (it stops
its servers: TERM, then KILL), kills what is left, and removes a temporary state dir.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import agent
from agent.core.errors import MedicError, ProbeError
from agent.demo.config import SERVER_MODULE, DemoSettings, ServerSpec, demo_config, plan_servers
from agent.demo.model import build_model
from agent.state import AGENT_FILE_NAME
from probes.linux.fstrust import atomic_write, ensure_private_dir
from probes.linux.procfs import read_cmdline

if TYPE_CHECKING:
    from agent.demo.load import LoadGenerator


def free_ports(count: int) -> list[int]:
    """Free loopback ports, all held open together while picking so they differ."""
    socks = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def child_env() -> dict[str, str]:
    """The environment of the agent and its servers: this medic importable, whatever the cwd."""
    root = str(Path(agent.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root + (os.pathsep + path if path else "")}


class Fleet:
    """The running demo: `start()` then `close()` (also as a context manager)."""

    def __init__(self, settings: DemoSettings, state_dir: Path | None = None) -> None:
        self.settings = settings
        self.temporary = state_dir is None
        self.state_dir = Path(tempfile.mkdtemp(prefix="medic-demo-")) if state_dir is None else state_dir
        self.servers: list[ServerSpec] = []
        self.url = ""
        self.agent: subprocess.Popen[bytes] | None = None
        self.load: LoadGenerator | None = None  # once started
        self.server_pids: set[int] = set()  # every server pid seen, killed at close if still there
        self.log_path = self.state_dir / "agent.log"

    def __enter__(self) -> Fleet:
        try:
            self.start()
        except BaseException:
            self.close()  # a half-started fleet is stopped too
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, timeout: float = 60.0) -> None:
        # numpy comes with the demo extra: `medic run` (a runtime-only install) borrows free_ports alone
        from agent.demo.load import LoadGenerator, request_body

        ensure_private_dir(self.state_dir, "demo state dir")  # it holds the config the agent obeys
        model = build_model(self.state_dir / "model.onnx", self.settings.shape)
        self.servers = plan_servers(self.settings, free_ports(self._count()))
        config = demo_config(self.settings, self.servers, model, self.state_dir)
        config_path = self.state_dir / "medic.yaml"
        _write_private(config_path, json.dumps(config, indent=2))  # JSON is YAML
        (self.state_dir / "agent" / AGENT_FILE_NAME).unlink(missing_ok=True)
        argv = [sys.executable, "-m", "agent.cli.main", "run", "--config", str(config_path)]
        with open(self.log_path, "ab") as log:
            self.agent = subprocess.Popen(
                [*argv, "--log-level", "warning"],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=child_env(),
                start_new_session=True,  # Ctrl-C reaches the demo only; it stops the agent in order
            )
        self.url = self._wait_for_agent(timeout)
        self._wait_for_servers(timeout)
        body = request_body(self.settings.batch, self.settings.shape.features)
        self.load = LoadGenerator({s.name: s.port for s in self.servers}, body, self.settings.rps)
        self.load.start()

    def _count(self) -> int:
        return self.settings.healthy + self.settings.leak + self.settings.slow

    def _wait_for_agent(self, timeout: float) -> str:
        import httpx

        info = self.state_dir / "agent" / AGENT_FILE_NAME
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check()
            if info.exists():
                try:
                    url: str = json.loads(info.read_text())["url"]
                    if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                        return url
                except (ValueError, KeyError, httpx.HTTPError):
                    pass
            time.sleep(0.2)
        raise MedicError(f"the demo's agent did not answer within {timeout:.0f}s; see {self.log_path}")

    def _wait_for_servers(self, timeout: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        waiting = list(self.servers)
        while waiting and time.monotonic() < deadline:
            self.check()
            for server in list(waiting):
                try:
                    if httpx.get(f"{server.url}/healthz", timeout=1).status_code == 200:
                        waiting.remove(server)
                except httpx.HTTPError:
                    pass
            time.sleep(0.2)
        if waiting:
            names = ", ".join(s.name for s in waiting)
            raise MedicError(f"demo servers {names} did not start within {timeout:.0f}s; see {self.log_path}")

    def check(self) -> None:
        if self.agent is not None and self.agent.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-1500:] if self.log_path.exists() else ""
            raise MedicError(
                f"the demo's agent exited with status {self.agent.returncode}"
                + (f":\n{tail.strip()}" if tail.strip() else f"; see {self.log_path}")
            )

    def note_pids(self, pids: list[int]) -> None:
        """Remember server pids seen through the API, so that close() can make sure they are gone."""
        self.server_pids.update(p for p in pids if p)

    def close(self) -> None:
        """Stop the load, then the agent (which stops its servers), then anything left; idempotent."""
        if self.load is not None:
            self.load.stop()
            self.load = None
        if self.agent is not None:
            _stop_group(self.agent, timeout=15.0)
            self.agent = None
        for pid in self.server_pids:
            _kill_if_demo_server(pid, self.state_dir)
        self.server_pids.clear()
        if self.temporary:
            shutil.rmtree(self.state_dir, ignore_errors=True)


def _write_private(path: Path, text: str) -> None:
    atomic_write(path, text.encode("utf-8"), 0o600)  # a fresh O_EXCL name renamed: no link followed


def _stop_group(proc: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM to the process (it stops its own children), SIGKILL to its group after `timeout`."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def _kill_if_demo_server(pid: int, state_dir: Path) -> None:
    """SIGKILL `pid` only if it still is one of this demo's servers (pids get reused)."""
    try:
        cmdline = read_cmdline(pid)
    except ProbeError:
        return
    if SERVER_MODULE in cmdline and any(str(state_dir) in arg for arg in cmdline):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
