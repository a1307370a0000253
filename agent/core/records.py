"""Typed records shared by probes, store, detectors, API and CLI, so that all agree on field names."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.core.histograms import Snapshot

if TYPE_CHECKING:  # the records stay free of pydantic, which `agent.core.types` imports
    from agent.core.types import Severity


@dataclass(frozen=True, slots=True)
class Sample:
    """One value of one metric of one instance at one time (unix seconds)."""

    instance: str
    metric: str
    ts: float
    value: float


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """A process as the kernel knows it; `start_time` tells a restart from a reused pid."""

    pid: int
    start_time: float  # unix seconds, from /proc/PID/stat starttime + btime


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """What a probe is pointed at: one live process of one instance, and the workers descended from it.

    Probes that read per-process figures (`process`, `smaps`) read the workers too and return their
    figures in `ProbeResult.processes`; the others speak for the instance's own process alone."""

    instance: str
    pid: int
    start_time: float
    labels: Mapping[str, str] = field(default_factory=dict)
    settings: Mapping[str, Any] = field(default_factory=dict)  # the instance's config, as plain data
    workers: tuple[ProcessIdentity, ...] = ()


@dataclass(slots=True)
class ProbeResult:
    """Samples a probe read, the histogram snapshots it took (the collector stores both), plus the
    figures it could not read (partial failure), the per-process figures of a process tree, `notes`:
    what it read that is not a number (where a figure came from), kept beside the instance's latest
    figures, and what it saw happen in the target (events the collector records, such as a tracing
    session that ended)."""

    samples: list[Sample] = field(default_factory=list)
    problems: list[Exception] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    # figures of each process of the instance (its own and its workers'), metric → value; the
    # collector sums them into the instance's `tree_*` figures and keeps them for the breakdown
    processes: dict[ProcessIdentity, dict[str, float]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)


@dataclass(slots=True)
class Event:
    """An entry of the event log: what happened, to which instance, and the figures behind it."""

    kind: str
    message: str
    instance: str | None = None
    severity: Severity = "info"
    data: dict[str, Any] = field(default_factory=dict)
    ts: float = field(default_factory=time.time)
    id: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "ts": self.ts,
            "instance": self.instance,
            "kind": self.kind,
            "severity": self.severity,
            "message": self.message,
            "data": self.data,
        }
