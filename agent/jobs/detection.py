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
import time
from dataclasses import asdict
from typing import Any

from agent.core.sql import where_clause
from agent.detect import DetectParams, Finding, InstanceSeries, Observation, Transition, evaluate, update
from agent.detect.attribution import attribution_for
from agent.detect.model import ACTIVE, ALLOCATED, JVM_HEAP_AFTER_GC, LIMIT_METRICS, RESIDENT, RSS, START_TIME
from agent.detect.slow import INPUT_METRICS as SLOW_METRICS
from agent.detect.slow import SlowParams, evaluate_slow, slo_from_settings
from agent.detect.slow import history as slow_history
from agent.detect.suspects import suspects_for
from agent.state.eventlog import EventLog
from agent.state.store import Store
from agent.watch.collector import KEEPALIVE
from agent.watch.tracker import Tracker

log = logging.getLogger("medic.detection")

MEMORY_METRICS = (RSS, ALLOCATED, ACTIVE, RESIDENT, JVM_HEAP_AFTER_GC, *LIMIT_METRICS)
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
        self, tracker: Tracker, store: Store, events: EventLog, params: DetectParams, slow: SlowParams
    ) -> None:
        self.tracker = tracker
        self.store = store
        self.events = events
        self.params = params
        self.slow = slow
        store.ensure_schema(_SCHEMA)
        self.active: list[Finding] = self._load_active()
        self.memory_tick = max((f.last_tick for f in self.active if f.kind != "slow"), default=-math.inf)
        self.slow_tick = max((f.last_tick for f in self.active if f.kind == "slow"), default=-math.inf)

    # ------------------------------------------------------------------------------ the job
    def run(self, now: float | None = None) -> list[Transition]:
        """Judge every instance at the newest grid instants not judged yet; returns the transitions.

        Memory findings are judged every `params.step`, slowness every `slow.step`, each on its
        own epoch-aligned grid.
        """
        now = time.time() if now is None else now
        memory_tick = math.floor(now / self.params.step + 1e-9) * self.params.step
        slow_tick = math.floor(now / self.slow.step + 1e-9) * self.slow.step
        judge_memory, judge_slow = memory_tick > self.memory_tick, slow_tick > self.slow_tick
        if not (judge_memory or judge_slow):
            return []
        with self.tracker.lock:
            states = [(s.name, dict(s.settings), s.memory_limit) for s in self.tracker.states.values()]
        upto = max(memory_tick, slow_tick)
        series = [self.load_series(name, upto, limit, judge_memory, judge_slow) for name, _, limit in states]
        transitions: list[Transition] = []
        keep = list(self.active)
        if judge_memory:
            observations: list[Observation] = []
            for item in series:
                observations.extend(evaluate(item, memory_tick, self.params))
            kept, changes = update([f for f in keep if f.kind != "slow"], observations, self.params)
            keep = kept + [f for f in keep if f.kind == "slow"]
            transitions += changes
            self.memory_tick = memory_tick
        if judge_slow:
            slos = {name: slo_from_settings(settings) for name, settings, _ in states}
            observations = evaluate_slow(series, slow_tick, self.slow, slos=slos)
            kept, changes = update([f for f in keep if f.kind == "slow"], observations, self.slow)  # type: ignore[arg-type]
            keep = [f for f in keep if f.kind != "slow"] + kept
            transitions += changes
            self.slow_tick = slow_tick
        self.active = keep
        self._explain(transitions, now)
        self._persist(self.active, transitions)
        for change in transitions:
            self._record(change)
        return transitions

    def load_series(
        self, instance: str, tick: float, limit: float | None, memory: bool = True, slow: bool = True
    ) -> InstanceSeries:
        """The series the detectors need up to `tick`: memory series over `params.history`, as the
        min and max of each sub-bucket; latency series over the slow detector's history."""
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
            since = tick - slow_history(self.slow)
            for metric in SLOW_METRICS:
                if metric in stored and metric not in points:
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
        """Name what grows on every leak that opens or changes: the suspects (classes, types, allocation
        sites) and the memory layer the growth is in. Failures here never hold back the finding."""
        by_id = {f.id: f for f in self.active}
        for change in transitions:
            finding = change.finding
            if finding.kind != "leak" or change.change == "resolved":
                continue
            since = max(finding.lifetime_start, now - self.params.long_window)
            try:
                suspects = [
                    s.to_dict() for s in suspects_for(self.store, finding.instance, since, now, limit=5)
                ]
                attribution = attribution_for(self.store, finding.instance, since, now).to_dict()
            except Exception:  # a bad snapshot must not stop detection
                log.exception("cannot explain the leak of %s", finding.instance)
                continue
            for target in (finding, by_id.get(finding.id)):
                if target is not None:
                    target.evidence["suspects"] = suspects
                    target.evidence["attribution"] = attribution

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
        self.events.emit(
            f"finding_{change.change}",
            f"{finding.kind} {change.change}: {finding.summary}"
            + (f" ({change.reason})" if change.reason else ""),
            instance=finding.instance,
            severity=severity,
            finding=_public(asdict(finding)),
            reason=change.reason,
        )


def _dump(finding: Finding) -> str:
    data = asdict(finding)
    if data["last_tick"] == -math.inf:
        data["last_tick"] = None
    return json.dumps(data, default=str)


def _public(data: dict[str, Any]) -> dict[str, Any]:
    """A finding as the API shows it: without the lifecycle's bookkeeping."""
    hidden = {"fire_streak", "clear_streak", "last_tick"}
    return {k: v for k, v in data.items() if k not in hidden}
