"""Real children launched, found and restarted as the agent's managed commands are: what the
runtime injects into the remediation engine as its `locate` and `managed_restart` hooks."""

from __future__ import annotations

import time
from collections.abc import Mapping

from agent.core.records import ProcessIdentity
from agent.watch.discovery import by_pid
from agent.watch.supervisor import ManagedProcess


class ManagedChildren:
    """One real `ManagedProcess` per instance, launched at once; `restarts` lists (name, when)."""

    def __init__(self, argvs: Mapping[str, list[str]]) -> None:
        self.managed = {name: ManagedProcess(name, argv, stop_timeout=2) for name, argv in argvs.items()}
        self.restarts: list[tuple[str, float]] = []
        for process in self.managed.values():
            process.launch()

    def locate(self, name: str) -> ProcessIdentity | None:
        pid = self.managed[name].pid
        return by_pid(pid) if pid else None

    def restart(self, name: str, timeout: float) -> int:
        self.restarts.append((name, time.time()))
        return self.managed[name].restart(timeout)

    def close(self, timeout: float = 2.0) -> None:
        """Stop every child for good (no relaunch)."""
        for process in self.managed.values():
            process.stopping = True
            process.stop(timeout)
