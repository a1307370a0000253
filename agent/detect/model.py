"""Records of the detection core: the series it judges, what one judgement observes, and findings.

The online path (the agent's scheduler over the store) and the offline path (`medic analyze`)
build the same `InstanceSeries` and get the same `Observation`s and `Finding`s back.

Metric roles. Detectors read series by the names of `agent.core.catalog`, plus names that the
allocator and JVM probes will emit; each role takes the first name present:

- memory judged against the limit: `tree_memory_bytes` (the instance's processes together: a server
  and its workers, see agent/watch/tree.py), else `rss_bytes`; the detectors read it under `RSS`
- live bytes (what a leak grows): `allocator_allocated_bytes`, else `jvm_heap_after_gc_bytes`,
  else `rss_bytes`; a Python target's small objects live in pymalloc's arenas, outside malloc's
  figures (`pymalloc_allocated_blocks` says pymalloc is there), so its RSS is judged as well
- allocator pages that hold live objects: `allocator_active_bytes` (jemalloc `stats.active`)
- allocator memory resident in RAM: `allocator_resident_bytes`, else `rss_bytes`
- the limit: `InstanceSeries.memory_limit`, else the latest `memory_limit_bytes` or
  `cgroup_memory_limit_bytes` sample
"""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from agent.core.types import Kind, Severity
    from agent.detect.seasonal import WorkloadProfile

RSS = "rss_bytes"
ALLOCATED = "allocator_allocated_bytes"
ACTIVE = "allocator_active_bytes"
RESIDENT = "allocator_resident_bytes"
RETAINED = "allocator_retained_bytes"  # jemalloc: virtual only, not RSS; kept for display, never judged
JVM_HEAP_AFTER_GC = "jvm_heap_after_gc_bytes"
PYMALLOC = "pymalloc_allocated_blocks"
LIMIT_METRICS = ("memory_limit_bytes", "cgroup_memory_limit_bytes")
START_TIME = "process_start_time_seconds"
TREE_MEMORY = "tree_memory_bytes"

Verdict = Literal["leak", "fragmentation", "allocator-retention", "working-set-plateau"]
State = Literal["firing", "holding", "clear", "unknown"]
FindingState = Literal["pending", "open", "resolved"]

Points = list[tuple[float, float]]


@dataclass(slots=True)
class InstanceSeries:
    """Everything the detectors need about one instance, held in memory.

    `series` maps a metric name to its `(ts, value)` points sorted by time. `restarts` are the
    times at which a new process lifetime began (the store records them as events); `None`
    means unknown, and the detectors infer them from `process_start_time_seconds`, gaps and
    resets. `started_at` is when the process of the first sample started, when that is before
    the first sample (the agent passes a window of its history; None: at the first sample).
    `memory_limit` overrides any limit series.
    """

    instance: str
    series: dict[str, Points]
    restarts: list[float] | None = None
    memory_limit: float | None = None
    started_at: float | None = None
    prior: WorkloadProfile | None = None
    """What the instance's workload is known to do (`agent.detect.memory.priors`), for a new process."""
    limit_source: str | None = None
    """Where the limit comes from: `config` (medic's config only: the kernel does not enforce it),
    `cgroup`, `host`; None when unknown (a recorded series, `medic analyze --limit`)."""

    def __post_init__(self) -> None:
        tree = self.series.get(TREE_MEMORY)
        if tree:  # the memory of the whole instance is what grows toward its limit, not its first process's
            # samples stored before the tree was measured (an agent of an earlier version) keep their
            # process RSS: the history that earlier lifetimes and the daily profile are learned from
            own = self.series.get(RSS) or []
            earlier = own[: bisect_left(own, (tree[0][0], -math.inf))]
            self.series = {**self.series, RSS: earlier + tree}

    def first_ts(self) -> float | None:
        starts = [points[0][0] for points in self.series.values() if points]
        return min(starts) if starts else None

    def last_ts(self) -> float | None:
        ends = [points[-1][0] for points in self.series.values() if points]
        return max(ends) if ends else None


@dataclass(slots=True)
class Observation:
    """What one judgement at time `tick` says about one kind of finding for one instance.

    `state` is `firing` (evidence strong enough to open), `clear` (clearly gone), `holding`
    (between the two thresholds: keep whatever is there) or `unknown` (cannot judge; `summary`
    says why). `lifetime_start` tells the lifecycle when the process restarted. `confirmed`: the
    fleet's evidence confirms a firing observation (several instances of one rollout fire at
    this judgement), so its finding opens at once, as a critical one does.
    """

    instance: str
    kind: Kind
    state: State
    tick: float
    lifetime_start: float
    summary: str
    severity: Severity = "info"
    verdict: Verdict | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    confirmed: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "kind": self.kind,
            "state": self.state,
            "tick": self.tick,
            "lifetime_start": self.lifetime_start,
            "severity": self.severity,
            "verdict": self.verdict,
            "summary": self.summary,
            "evidence": self.evidence,
        }


@dataclass(slots=True)
class Finding:
    """A memory problem of one instance, from its first firing judgement to its resolution.

    `pending` findings have fired fewer than `open_after` times in a row and are not shown to
    users; `opened_at` is when the finding opened (the time it fires), `first_seen` the first
    firing judgement of the streak that opened it.
    """

    id: str
    instance: str
    kind: Kind
    severity: Severity
    state: FindingState
    first_seen: float
    opened_at: float | None
    updated_at: float
    resolved_at: float | None
    summary: str
    verdict: Verdict | None
    evidence: dict[str, Any]
    lifetime_start: float
    fire_streak: int = 0
    clear_streak: int = 0
    challenger: Verdict | None = None  # a verdict other than `verdict` seen in the last firing judgements
    challenger_streak: int = 0
    last_tick: float = float("-inf")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "instance": self.instance,
            "kind": self.kind,
            "state": self.state,
            "severity": self.severity,
            "verdict": self.verdict,
            "first_seen": self.first_seen,
            "opened_at": self.opened_at,
            "updated_at": self.updated_at,
            "resolved_at": self.resolved_at,
            "summary": self.summary,
            "evidence": self.evidence,
        }


@dataclass(frozen=True, slots=True)
class Transition:
    """A change of a finding that the agent records as an event: opened, updated or resolved."""

    change: Literal["opened", "updated", "resolved"]
    finding: Finding
    ts: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "change": self.change,
            "ts": self.ts,
            "reason": self.reason,
            "finding": self.finding.to_dict(),
        }


@dataclass(slots=True)
class InstanceAnalysis:
    """What a replay found for one instance: every finding, opened or resolved, with its times."""

    instance: str
    findings: list[Finding]
    transitions: list[Transition]
    notes: list[str]
    first_ts: float | None
    last_ts: float | None
    restarts: list[float] = field(default_factory=list)
    at_open: dict[str, Finding] = field(default_factory=dict)  # each finding as it was when it opened

    def first_fired(self, kind: str) -> float | None:
        times = [f.opened_at for f in self.findings if f.kind == kind and f.opened_at is not None]
        return min(times) if times else None

    def _finding_dict(self, finding: Finding) -> dict[str, Any]:
        doc = finding.to_dict()
        opened = self.at_open.get(finding.id)
        if opened is not None:
            doc["at_open"] = {
                "severity": opened.severity,
                "summary": opened.summary,
                "evidence": opened.evidence,
            }
        return doc

    def to_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "first_ts": self.first_ts,
            "last_ts": self.last_ts,
            "restarts": self.restarts,
            "findings": [self._finding_dict(f) for f in self.findings],
            "notes": self.notes,
        }
