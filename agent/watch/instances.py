"""Runtime state of each instance the agent watches, and its JSON form for the API."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Literal

from agent.config.model import InstanceSpec
from agent.core.records import ProcessIdentity
from agent.state.identities import AdoptedProcess
from agent.watch.ceilings import ceilings
from agent.watch.tree import ProcessTree

Status = Literal["up", "down", "waiting", "exited"]


@dataclass(slots=True)
class ProbeHealth:
    """How one probe fares on one instance: the last outcome and counters (slotted: one per instance and probe)."""

    ok: bool = True
    errors_total: int = 0
    last_error: str | None = None
    last_success: float | None = None
    last_duration: float = 0.0
    unavailable: str | None = None  # why the probe has no data for this instance (not an error)
    retry_at: float = 0.0  # when to try an unavailable probe again


@dataclass(slots=True)
class InstanceState:
    name: str
    spec: InstanceSpec
    slot: int | None = None  # cmdline `select: all`: which match this instance follows
    pid: int | None = None
    start_time: float | None = None
    status: Status = "waiting"
    status_reason: str = "not found yet"
    restarts: int = 0
    exit_code: int | None = None
    memory_limit: float | None = None
    memory_limit_source: str | None = None
    last_probe: float | None = None
    cpu_percent: float | None = None
    latest: dict[str, float] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)  # what probes read that is not a number
    ceilings_said: str | None = None  # the JVM ceilings last announced (agent/watch/ceilings.py)
    probes: dict[str, ProbeHealth] = field(default_factory=dict)
    adopted: AdoptedProcess | None = None  # what the followed process matched when it was adopted
    refused: ProcessIdentity | None = None  # a process at the instance's pid that is not the instance
    tree: ProcessTree = field(default_factory=ProcessTree)  # its process and the workers below it
    _last_cpu: tuple[float, float] | None = None
    _settings: dict[str, Any] | None = None

    @property
    def labels(self) -> dict[str, str]:
        return dict(self.spec.labels)

    @property
    def settings(self) -> dict[str, Any]:
        """The instance's config as plain data, for probes (computed once: specs are immutable)."""
        if self._settings is None:
            self._settings = self.spec.model_dump(mode="json")
        return self._settings

    def observe_cpu(self, now: float, cpu_seconds: float) -> None:
        if self._last_cpu is not None:
            then, before = self._last_cpu
            if now > then and cpu_seconds >= before:
                self.cpu_percent = 100.0 * (cpu_seconds - before) / (now - then)
        self._last_cpu = (now, cpu_seconds)

    def reset_process(self) -> None:
        """Forget figures of the previous process (after a restart or when it vanished)."""
        self.latest.clear()
        self.notes.clear()
        self.ceilings_said = None
        self.cpu_percent = None
        self._last_cpu = None

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        now = time.time() if now is None else now
        rss = self.latest.get("rss_bytes")
        memory = self.latest.get("tree_memory_bytes", rss)
        errors = sum(p.errors_total for p in self.probes.values())
        return {
            "name": self.name,
            "labels": self.labels,
            "mode": "managed" if self.spec.match.managed else "attached",
            "pid": self.pid,
            "status": self.status,
            "status_reason": self.status_reason,
            "start_time": self.start_time,
            "uptime_seconds": (now - self.start_time) if self.start_time and self.status == "up" else None,
            "restarts": self.restarts,
            "exit_code": self.exit_code,
            "rss_bytes": rss,
            "memory_limit_bytes": self.memory_limit,
            "memory_limit_source": self.memory_limit_source,
            "memory_bytes": memory,
            "memory_source": self.tree.source
            if "tree_memory_bytes" in self.latest
            else "rss"
            if rss
            else None,
            "ceilings": [ceiling.to_dict() for ceiling in ceilings(self)],
            "memory_used_ratio": (memory / self.memory_limit) if memory and self.memory_limit else None,
            "cpu_percent": self.cpu_percent,
            "threads": self.latest.get("threads"),
            "last_probe": self.last_probe,
            "last_probe_age_seconds": (now - self.last_probe) if self.last_probe else None,
            "probe_errors_total": errors,
            "probes": {
                name: {
                    "ok": health.ok,
                    "errors_total": health.errors_total,
                    "last_error": health.last_error,
                    "last_success": health.last_success,
                    "last_duration_seconds": health.last_duration,
                    "unavailable": health.unavailable,
                }
                for name, health in sorted(self.probes.items())
            },
            "workers": len(self.tree.workers) if self.status == "up" else None,
            "worker_restarts": self.tree.worker_restarts,
            "workers_not_followed": self.tree.capped,
            "latest": dict(sorted(self.latest.items())),
            "settings": self.settings,
        }
