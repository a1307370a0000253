"""Online detection: the detectors of `agent.detect` run over the store on the judgement grid.

The job judges each instance at the instants `k × params.step` (epoch-aligned), exactly the
instants `medic analyze` replays, so a recording analysed offline finds what the agent found.
Series are read from the store as the minimum and the maximum of each sub-bucket (a tenth of a
detection bucket), which keeps the lower envelope and the peaks exact while a week of history
stays a few thousand points per series. Findings (pending and open) are persisted, so an agent
restart neither forgets nor re-opens them; every opened/updated/resolved transition is an event.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from dataclasses import asdict
from typing import Any

from agent.core.sql import where_clause
from agent.core.timescale import TimeScale
from agent.core.units import format_bytes
from agent.detect import DetectParams, Finding, InstanceSeries, Observation, Transition, tick_for, update
from agent.detect.explain.attribution import explain
from agent.detect.explain.pysuspects import collecting, python_target, unexplained
from agent.detect.lifecycle import earlier_process, past_the_limit, restarted
from agent.detect.memory.fleet import judge_fleet, with_priors
from agent.detect.memory.growth import REQUESTS
from agent.detect.memory.jvm import INPUT_METRICS as JVM_INPUTS
from agent.detect.memory.priors import PriorBook, merge, workload_key
from agent.detect.model import (
    ACTIVE,
    ALLOCATED,
    JVM_HEAP_AFTER_GC,
    LIMIT_METRICS,
    PYMALLOC,
    RESIDENT,
    RSS,
    START_TIME,
    TREE_MEMORY,
)
from agent.detect.seasonal import WorkloadProfile
from agent.detect.slow.detector import (
    CAUSE_METRICS,
    Slo,
    SlowParams,
    causes_history,
    evaluate_slow,
    slo_from_settings,
)
from agent.detect.slow.detector import INPUT_METRICS as SLOW_METRICS
from agent.detect.slow.detector import history as slow_history
from agent.state.eventlog import EventLog
from agent.state.store import Store
from agent.watch.collector import KEEPALIVE
from agent.watch.tracker import Tracker

log = logging.getLogger("medic.detection")

EXPLAINED_KINDS = ("leak", "oom-risk")
PROCESS_TAIL = "; it grows in "  # the summary's tail naming the process of a tree that grows
MEMORY_METRICS = (
    RSS,
    TREE_MEMORY,
    ALLOCATED,
    ACTIVE,
    RESIDENT,
    JVM_HEAP_AFTER_GC,
    *JVM_INPUTS,
    PYMALLOC,
    *LIMIT_METRICS,
    *REQUESTS,
)
SUB_BUCKETS = 10  # store reads per detection bucket: min and max of each
_SCHEMA = """
CREATE TABLE IF NOT EXISTS findings (
    id TEXT PRIMARY KEY, instance TEXT NOT NULL, kind TEXT NOT NULL, state TEXT NOT NULL,
    opened_at REAL, updated_at REAL NOT NULL, resolved_at REAL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS findings_by_instance ON findings (instance, state);
CREATE INDEX IF NOT EXISTS findings_by_state ON findings (state, updated_at);
"""


class Detection:
    def __init__(
        self,
        tracker: Tracker,
        store: Store,
        events: EventLog,
        params: DetectParams,
        slow: SlowParams,
        workload_label: str = "fleet",
        scale: TimeScale | None = None,
    ) -> None:
        self.workload_label = workload_label
        self.scale = scale or TimeScale()  # agent.time_scale: the SLOs' `for` windows are on it too
        self.priors = PriorBook()  # peers' and Prometheus' profiles are offered here (`PriorBook.offer`)
        self._learned: dict[tuple[str, float], WorkloadProfile | None] = {}
        self._keys: dict[str, str] = {}  # instance -> workload key, as of the last judgement
        self._sites_requested: set[tuple[str, float]] = set()  # (instance, lifetime) asked for sites
        self.tracker = tracker
        self.store = store
        self.events = events
        self.params = params
        self.slow = slow
        store.ensure_schema(_SCHEMA)
        # one writer of `active` at a time: the scheduled judgement and findings put from other jobs
        self._lock = threading.RLock()
        self.active: list[Finding] = self._load_active()
        self.memory_tick = max((f.last_tick for f in self.active if f.kind != "slow"), default=-math.inf)
        self.slow_tick = max((f.last_tick for f in self.active if f.kind == "slow"), default=-math.inf)

    # ------------------------------------------------------------------------------ the job
    def run(self, now: float | None = None) -> list[Transition]:
        """Judge every instance at the newest grid instants not judged yet; returns the transitions.

        Memory findings are judged every `params.step`, slowness every `slow.step`, each on its
        own epoch-aligned grid.
        """
        with self._lock:
            return self._run(now)

    def _run(self, now: float | None) -> list[Transition]:
        now = time.time() if now is None else now
        memory_tick = math.floor(now / self.params.step + 1e-9) * self.params.step
        slow_tick = math.floor(now / self.slow.step + 1e-9) * self.slow.step
        judge_memory, judge_slow = memory_tick > self.memory_tick, slow_tick > self.slow_tick
        with self.tracker.lock:
            starts = {s.name: s.start_time for s in self.tracker.states.values() if s.start_time is not None}
        resolved = self._restarted(starts, now)  # recorded already
        if not (judge_memory or judge_slow):
            return resolved
        with self.tracker.lock:
            states = [(s.name, dict(s.settings), s.memory_limit) for s in self.tracker.states.values()]
            sources = {s.name: s.memory_limit_source for s in self.tracker.states.values()}
        upto = max(memory_tick, slow_tick)
        slos = {name: slo_from_settings(settings, self.scale) for name, settings, _ in states}
        series = [
            self.load_series(name, upto, limit, judge_memory, judge_slow, slos[name])
            for name, _, limit in states
        ]
        for item in series:  # whether the kernel enforces the limit (a config-only one it does not)
            item.limit_source = sources.get(item.instance)
        transitions: list[Transition] = []
        keep = list(self.active)
        if judge_memory:
            observations: list[Observation] = []
            for key, members in self._workloads(states, series).items():
                fleet = with_priors(members, self.params, self.priors.get(key), learned=self._learned)
                observations.extend(judge_fleet(fleet, tick_for(memory_tick, self.params), self.params))
            # a judgement of the samples of a process that is gone would open its findings anew
            observations = [
                o for o in observations if not earlier_process(o.instance, o.lifetime_start, starts)
            ]
            kept, changes = update([f for f in keep if f.kind != "slow"], observations, self.params)
            keep = past_the_limit(kept) + [f for f in keep if f.kind == "slow"]
            transitions += changes
            self.memory_tick = memory_tick
        if judge_slow:
            observations = evaluate_slow(series, slow_tick, self.slow, slos=slos)
            kept, changes = update([f for f in keep if f.kind == "slow"], observations, self.slow)  # type: ignore[arg-type]
            keep = [f for f in keep if f.kind != "slow"] + kept
            transitions += changes
            self.slow_tick = slow_tick
        self.active = keep
        if judge_memory:
            self._explain(transitions, now)
        self._persist(self.active, transitions)
        for change in transitions:
            self._record(change)
        return resolved + transitions

    def _restarted(self, starts: dict[str, float], now: float) -> list[Transition]:
        """Resolve at once the memory findings of a process its instance no longer runs (`lifecycle.restarted`)."""
        self.active, transitions = restarted(self.active, starts, now)
        if transitions:
            self._persist(self.active, transitions)
            for change in transitions:
                self._record(change)
        return transitions

    def _workloads(
        self, states: list[tuple[str, dict[str, Any], float | None]], series: list[InstanceSeries]
    ) -> dict[str, list[InstanceSeries]]:
        """The instances grouped by workload key (their `workload_label` label, else their name)."""
        groups: dict[str, list[InstanceSeries]] = {}
        for (name, settings, _), item in zip(states, series, strict=True):
            labels = settings.get("labels") or {}
            key = workload_key(labels, name, self.workload_label)
            self._keys[name] = key
            groups.setdefault(key, []).append(item)
        return groups

    def workload_keys(self) -> list[str]:
        """The workload key of every tracked instance (what the peers job reads profiles for),
        known from the config before the first judgement."""
        with self.tracker.lock:
            found = {
                workload_key(s.settings.get("labels") or {}, s.name, self.workload_label)
                for s in self.tracker.states.values()
            }
        return sorted(found)

    def shared_profiles(self) -> dict[str, dict[str, Any]]:
        """What this agent learned of each workload from its own store, to share with peers (the
        coordinator's fleet view): per workload key, `WorkloadProfile.to_dict()` (under 2 KiB).
        A peer offers each to its `priors` as the source `peers`."""
        by_key: dict[str, list[WorkloadProfile | None]] = {}
        for (instance, _), profile in list(self._learned.items()):
            key = self._keys.get(instance)
            if key is not None:
                by_key.setdefault(key, []).append(profile)
        return {key: p.to_dict() for key, found in by_key.items() if (p := merge(found)) is not None}

    def load_series(
        self,
        instance: str,
        tick: float,
        limit: float | None,
        memory: bool = True,
        slow: bool = True,
        slo: Slo | None = None,
    ) -> InstanceSeries:
        """The series the detectors need up to `tick`: memory series over `params.history`, as the
        min and max of each sub-bucket; latency series over the slow detector's history (with the
        instance's SLO window, which may be the longest), the likely causes' over their window."""
        stored = set(self.store.metrics(instance))
        points: dict[str, list[tuple[float, float]]] = {}
        if memory:
            sub = self.params.bucket / SUB_BUCKETS
            since = math.floor((tick - self.params.history) / sub) * sub
            for metric in MEMORY_METRICS:
                if metric in stored:
                    low = self.store.series(instance, metric, since, tick, sub, "min", 10**7, now=tick)
                    high = self.store.series(instance, metric, since, tick, sub, "max", 10**7, now=tick)
                    points[metric] = sorted(low.points + high.points)
            started_at, restarts = (
                self._lifetimes(instance, since, tick) if START_TIME in stored else (None, None)
            )
        if slow:
            latency_since = tick - slow_history(self.slow, {instance: slo})
            causes_since = tick - causes_history(self.slow, {instance: slo})
            for metric in SLOW_METRICS:
                if metric in stored and metric not in points:
                    since = causes_since if metric in CAUSE_METRICS else latency_since
                    points[metric] = self.store.series(
                        instance, metric, since, tick, max_points=10**7, now=tick
                    ).points
        if not memory:
            started_at, restarts = None, None
        return InstanceSeries(instance, points, restarts=restarts, memory_limit=limit, started_at=started_at)

    def _lifetimes(self, instance: str, since: float, tick: float) -> tuple[float | None, list[float]]:
        """When the process of the first sample started, and when later processes started, from the
        stored start times (looked up a little before `since`: unchanged values are stored once a minute)."""
        stored = self.store.series(
            instance, START_TIME, since - 2 * KEEPALIVE, tick, max_points=10**7, now=tick
        )
        starts = sorted({value for _, value in stored.points})
        if not starts:
            return None, []
        before = [value for ts, value in stored.points if ts <= since]
        first = before[-1] if before else starts[0]
        return first, [start for start in starts if start > first]

    def _explain(self, transitions: list[Transition], now: float) -> None:
        """Name what grows, at every memory judgement, on every leak and oom-risk finding (pending ones
        too, so that the finding opens with them): the suspects (classes, types, allocation sites) and
        the memory layer the growth is in. A finding keeps its last explanation until a new one is
        made (`lifecycle` carries it across judgements); failures here never hold back the finding."""
        explained = [f for f in self.active if f.kind in EXPLAINED_KINDS]
        latest = {change.finding.id: change.finding for change in transitions if change.change != "resolved"}
        by_instance: dict[str, list[Finding]] = {}
        for finding in explained:
            by_instance.setdefault(finding.instance, []).append(finding)
            if finding.id in latest:
                by_instance[finding.instance].append(latest[finding.id])
        for instance, findings in by_instance.items():
            since = max(max(f.lifetime_start for f in findings), now - self.params.long_window)
            self._name_process(instance, findings, since, now)
            try:
                explanation = explain(self.store, instance, since, now)
                explanation["collecting"] = self._collecting(instance, findings, since, now, explanation)
            except Exception:  # a bad snapshot must not stop detection
                log.exception("cannot explain the memory growth of %s", instance)
                continue
            for finding in findings:
                finding.evidence |= explanation

    def _name_process(self, instance: str, findings: list[Finding], since: float, now: float) -> None:
        """On an instance of several processes (a server and its workers), name the one whose memory
        grew most since `since` (`evidence.process`, and the summary): the instance's total is judged,
        the process is its cause. Its history is the tracker's, kept since medic first saw it."""
        with self.tracker.lock:
            state = self.tracker.states.get(instance)
            cause = (
                state.tree.cause(since, now) if state is not None and len(state.tree.members) > 1 else None
            )
        for finding in findings:
            if PROCESS_TAIL in finding.summary:
                continue  # named already at this judgement (the same finding, listed twice)
            finding.evidence.pop("process", None)
            if cause is None:
                continue
            finding.evidence["process"] = cause
            finding.summary = tree_words(finding.summary, cause["processes"])
            finding.summary += (
                f"{PROCESS_TAIL}{cause['role']} pid {cause['pid']} "
                f"(+{format_bytes(cause['growth_bytes'])}, {format_bytes(cause['growth_bytes_per_hour'])}/h)"
            )

    def _collecting(
        self, instance: str, findings: list[Finding], since: float, now: float, explanation: dict[str, Any]
    ) -> dict[str, Any] | None:
        """What the leak findings of `instance` wait for (`agent.detect.explain.pysuspects.collecting`); a leak
        the type view cannot explain asks for allocation sites once, while still pending (an open one
        has asked already: the collector starts them when a leak opens)."""
        leaks = [f for f in findings if f.kind == "leak"]
        if not leaks:
            return None
        suspects = explanation["suspects"]
        key = (instance, max(f.lifetime_start for f in leaks))
        requested = key in self._sites_requested or any(f.state == "open" for f in leaks)
        if not requested and unexplained(suspects) and python_target(self.store, instance, since, now):
            self._sites_requested.add(key)
            requested = True
            self.events.emit(
                "sites_requested",
                f"the type histograms of {instance} name nothing that explains its growth: allocation "
                "sites requested before the leak finding opens",
                instance=instance,
                finding=leaks[0].id,
            )
        return collecting(self.store, instance, since, now, suspects, requested, key[1])

    # ------------------------------------------------------------------------------ queries
    def findings(
        self,
        instance: str | None = None,
        kind: str | None = None,
        state: str | None = "open",
        limit: int = 500,
    ) -> list[dict[str, Any]]:
        where, args = where_clause(
            [
                ("instance = ?", instance or None),
                ("kind = ?", kind or None),
                ("state = ?", None if state == "all" else state or None),
            ]
        )
        rows = self.store.query(
            f"SELECT data FROM findings{where} ORDER BY updated_at DESC LIMIT ?", [*args, limit]
        )
        return [_public(json.loads(row[0])) for row in rows]

    def open_findings(self) -> list[Finding]:
        return [f for f in self.active if f.state == "open"]

    def put_finding(self, change: Transition) -> None:
        """A finding judged outside the detectors (a crash loop, from the supervisor's record): kept
        with the others, persisted in the same table and recorded as the same `finding_*` event."""
        finding = change.finding
        keep = change.change != "resolved"
        with self._lock:
            self.active = [f for f in self.active if f.id != finding.id] + ([finding] if keep else [])
            self._persist([finding] if keep else [], [change])
            self._record(change)

    # ------------------------------------------------------------------------------ persistence
    def _load_active(self) -> list[Finding]:
        rows = self.store.query("SELECT data FROM findings WHERE state IN ('pending', 'open')")
        found = []
        for (data,) in rows:
            try:
                fields = json.loads(data)
                if fields.get("last_tick") is None:
                    fields["last_tick"] = -math.inf
                found.append(Finding(**fields))
            except (TypeError, ValueError) as exc:
                log.warning("a stored finding could not be restored and is skipped: %s", exc)
        return found

    def _persist(self, active: list[Finding], transitions: list[Transition]) -> None:
        rows = {f.id: f for f in active}
        for change in transitions:
            rows.setdefault(change.finding.id, change.finding)
        with self.store.transaction() as db:
            db.executemany(
                """INSERT INTO findings VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT (id) DO UPDATE SET state=excluded.state, opened_at=excluded.opened_at,
                   updated_at=excluded.updated_at, resolved_at=excluded.resolved_at, data=excluded.data""",
                [
                    (f.id, f.instance, f.kind, f.state, f.opened_at, f.updated_at, f.resolved_at, _dump(f))
                    for f in rows.values()
                ],
            )

    def _record(self, change: Transition) -> None:
        finding = change.finding
        severity = finding.severity if change.change != "resolved" else "info"
        # the summary is said once: a reason that repeats it (an opening, an update's tail) adds only the rest
        process = finding.evidence.get("process") if PROCESS_TAIL in finding.summary else None
        said = tree_words(change.reason, process["processes"]) if isinstance(process, dict) else change.reason
        reason = said.removesuffix(finding.summary.split(PROCESS_TAIL)[0]).removesuffix(": ")
        self.events.emit(
            f"finding_{change.change}",
            f"{finding.kind} {change.change}: {finding.summary}" + (f" ({reason})" if reason else ""),
            instance=finding.instance,
            severity=severity,
            finding=_public(asdict(finding)),
            reason=change.reason,
        )


def tree_words(text: str, processes: int) -> str:
    """A detector's words for an instance of several processes: it judges their total under the name
    of RSS (`agent.detect.model`), which a person reading "RSS" would take for one process's."""
    return text.replace("in rss_bytes", f"in the memory of its {processes} processes").replace(
        " RSS peaks ", " memory peaks "
    )


def _dump(finding: Finding) -> str:
    data = asdict(finding)
    if data["last_tick"] == -math.inf:
        data["last_tick"] = None
    return json.dumps(data, default=str)


def _public(data: dict[str, Any]) -> dict[str, Any]:
    """A finding as the API shows it: without the lifecycle's bookkeeping."""
    hidden = {"fire_streak", "clear_streak", "last_tick", "challenger", "challenger_streak"}
    return {k: v for k, v in data.items() if k not in hidden}
