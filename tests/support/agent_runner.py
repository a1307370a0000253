"""A real `medic run` process for the end-to-end tests, on a free loopback port with its own state dir,
and the one way tests run the `medic` CLI in a subprocess (`medic_cli`, `AgentRunner.cli`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path

import httpx
import psutil
import yaml

from support.procs import PYTHON, REPO, SpawnFn, wait_until

# where the CLI looks for the admin token (besides --token-file and ./medic-state/admin.token)
TOKEN_SOURCES = ("MEDIC_TOKEN", "MEDIC_TOKEN_FILE", "MEDIC_STATE_DIR")


def medic_cli(
    *args: str, env: Mapping[str, str | None] | None = None, timeout: float = 30
) -> subprocess.CompletedProcess:
    """`medic ARGS` in a subprocess of its own, as typed at a shell: this checkout's code, the test's
    working directory and environment, with `env` on top (a None value unsets the variable). For
    commands that need no agent of the test's, or that must find it themselves; `AgentRunner.cli`
    for one the test started."""
    merged = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [PYTHON, "-m", "agent.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={key: value for key, value in merged.items() if value is not None},
    )


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
        config = {
            **config,
            "agent": {"listen": "127.0.0.1:0", "state_dir": str(self.state_dir), **config.get("agent", {})},
        }
        path = self.tmp_path / "medic.yaml"
        path.write_text(yaml.safe_dump(config))
        (self.state_dir / "agent.json").unlink(missing_ok=True)
        argv = [*(prefix or []), PYTHON, "-m", "agent.cli.main", "run", "--config", str(path), *extra_args]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        with open(self.log, "ab") as log:  # the child keeps its own copy of the descriptor
            self.proc = self._spawn(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        if wait:
            self.wait_started()
        return self.proc

    def wait_started(self, timeout: float = 60.0) -> None:
        """Wait for agent.json and /healthz; generous: a cold first start compiles and imports everything."""
        info = self.state_dir / "agent.json"

        def started() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"agent exited with {self.proc.returncode}:\n{self.log.read_text()}")
            return info.exists()

        wait_until(started, timeout)
        self.url = json.loads(info.read_text())["url"]
        wait_until(lambda: self._healthy(), timeout)

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def get(self, path: str, **params):
        self._note_children()
        response = httpx.get(f"{self.url}{path}", params=params, timeout=5)
        response.raise_for_status()
        return response.json() if "json" in response.headers.get("content-type", "") else response.text

    def cli(
        self,
        *args: str,
        token: bool = True,
        env: Mapping[str, str | None] | None = None,
        timeout: float = 30,
    ) -> subprocess.CompletedProcess:
        """`medic ARGS --url URL` against this agent, in a subprocess, as on-call would type it. With
        `token` the CLI finds the admin token through MEDIC_STATE_DIR (the agent's state dir), as
        the agent's own host does; without it the CLI is given none."""
        found = {"MEDIC_STATE_DIR": str(self.state_dir)} if token else dict.fromkeys(TOKEN_SOURCES)
        return medic_cli(*args, "--url", self.url, env={**found, **(env or {})}, timeout=timeout)

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
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self._children.update(psutil.Process(self.proc.pid).children(recursive=True))
        except psutil.Error:
            pass

    def close(self) -> None:
        """Stop the agent the way an operator would (it stops what it launched), then kill any
        child of it that is still running."""
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
