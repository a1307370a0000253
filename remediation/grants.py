"""One planner per namespace: the elected leader plans the whole fleet, the others follow its grants.

Each step every agent publishes its own entries (written only when they change) and campaigns
(`Coordinator.campaign`, from the step's one read of `control/`). Then:

    leader    reads every agent's entries (a watched copy in etcd) and the restart history, runs
              `planner.plan` exactly as before, and writes each other agent its `PlannedGrant`s
              (slot, not-before, the leader's fencing revision), only those that changed
    follower  when it wants a restart, reads its grants (with `control/`, one read more) and turns
              them into its plan entries; when one comes due it reads the fleet and the history
              once, for the blockers and the budget, and the slot acquisition checks the grant's
              revision against the current leader atomically (`acquire`)

Budget, stagger by deadline, cooldowns and windows are the planner's and the budget's, unchanged;
the budget is still checked atomically at `acquire`, so even two leaders at once (a partition
healing) cannot put more restarts in flight than it allows. Dry-run keeps every agent planning for
itself from the whole view (its would-be restarts are known only to itself, and count for the
fleet-wide limits as enforce's restarts would). Without the coordinator, nothing is granted and
the error says why.

Each step also reads the namespace's controls, the fleet-wide pause and the leader (the same read
of `control/`), and keeps them as `control` for the engine's gate and
`medic plan`, so that showing them costs the coordinator nothing. While the coordinator cannot be
read, the last pause seen keeps holding until its own expiry (fail closed).
"""

from __future__ import annotations

import json
import threading
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from remediation import planner
from remediation.budget import BudgetLimits
from remediation.coordinator import Coordinator
from remediation.coordinator.base import Leadership, PlannedGrant, pause_over, read_pause, shown_pause
from remediation.deadlines import Clocks, anchored
from remediation.errors import CoordinatorError
from remediation.fleet_view import shared_view
from remediation.model import FleetEntry, Plan, PlanEntry, RestartRecord
from remediation.planner import PlanSettings
from remediation.text import at
from remediation.windows import Windows


@dataclass(slots=True)
class Planned:
    """What one step plans from: the fleet it sees, the history, the plan (or the coordinator's error)."""

    fleet: list[FleetEntry]
    history: list[RestartRecord]
    plan: Plan
    error: str | None = None
    role: str = "follower"  # leader, follower, or alone (dry-run: plans for itself)
    grants_written: int = 0
    leader: str | None = None
    granted: dict[str, PlannedGrant] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class FleetControl:
    """What the planner last read of the namespace's controls."""

    paused: dict[str, Any] | None = None  # the fleet pause (`read_pause`'s record)
    leader: dict[str, Any] | None = None  # {agent, revision, since}; None: the seat is vacant
    role: str = "alone"  # leader, follower, or alone (dry-run, or the coordinator failed)
    read_at: float | None = None  # when they were read; None: not yet
    error: str | None = None  # why they could not be read at the last step
    clocks: Clocks = field(default_factory=Clocks)  # the pause's time (remediation.deadlines)

    def pause_at(self, now: float) -> dict[str, Any] | None:
        """The fleet pause while it holds at `now` (a cached one ends at its own expiry too, on the
        boot clock when it was set on this boot: moving the wall clock does not end it), with its
        `until` on today's wall clock."""
        if self.paused is None or pause_over(self.paused, now, self.clocks):
            return None
        return shown_pause(self.paused, now, self.clocks)


class ElectedPlanner:
    def __init__(
        self,
        coordinator: Coordinator,
        agent_id: str,
        *,
        limits: BudgetLimits,
        windows: Windows,
        leader_ttl: float,
        fleet_ttl: float,
        spread: float = 0.0,
    ) -> None:
        self.coordinator = coordinator
        self.agent_id = agent_id
        self.limits = limits
        self.windows = windows
        self.leader_ttl = leader_ttl
        self.fleet_ttl = fleet_ttl
        self.spread = spread
        self.leadership: Leadership | None = None
        # the coordinator's clocks: a fleet pause set on this host lasts on its boot clock
        self.control = FleetControl(clocks=getattr(coordinator, "clocks", None) or Clocks())
        self._control_lock = threading.Lock()
        self._control_writes = 0  # pause writes by this agent: a step's older read must not undo one

    def step(
        self,
        now: float,
        mine: list[FleetEntry],
        since: float,
        settings: PlanSettings,
        *,
        dry_run: bool = False,
        extra_history: Sequence[RestartRecord] = (),
        skip: frozenset[str] = frozenset(),
    ) -> Planned:
        """One step's plan. In dry-run every agent plans alone, with its would-be restarts in
        `extra_history`, leaving out the instances in `skip` (those a would-be restart already
        answered: `remediation.dry_run`)."""
        writes = self._control_writes
        if dry_run:
            fleet, history, error = shared_view(self.coordinator, self.agent_id, mine, self.fleet_ttl, since)
            history = [*history, *extra_history]
            planned = [e for e in fleet if e.instance not in skip]
            plan = planner.plan(planned, history, self.limits, settings, now, self.windows)
            try:
                self._read_control(now, writes, "alone")
            except CoordinatorError as exc:
                self._keep_control(now, writes, str(exc))
            return Planned(fleet, history, plan, error, role="alone")
        try:
            self.coordinator.publish(self.agent_id, mine, self.fleet_ttl)
            self.leadership = self.coordinator.campaign(self.agent_id, self.leader_ttl, self.spread)
            if self.leadership is not None:
                return self._lead(self.leadership, now, mine, since, settings, extra_history, writes)
            return self._follow(now, mine, since, extra_history, writes)
        except CoordinatorError as exc:  # planned alone, so each decision says the lock is what is missing
            self.leadership = None
            self._keep_control(now, writes, str(exc))
            history = list(extra_history)
            plan = planner.plan(mine, history, self.limits, settings, now, self.windows)
            return Planned(list(mine), history, plan, str(exc), role="alone")

    # ----------------------------------------------------------------------------- the controls
    def set_fleet_pause(self, pause: dict[str, Any] | None, now: float) -> dict[str, Any] | None:
        """Set (or lift, with None) the namespace's pause in the coordinator and in `control` at
        once; returns the pause it replaced. `CoordinatorError` when it cannot be written (then
        nothing changed)."""
        try:
            previous = self.coordinator.fleet_pause()
        except CoordinatorError:  # a watch that is down must not stop the switch: the write says
            previous = self.control.pause_at(now)
        if pause is not None and pause.get("until") is not None:  # its end on this host's boot clock too
            pause = anchored(pause, now, self.control.clocks)
        self.coordinator.set_fleet_pause(pause)
        with self._control_lock:
            self._control_writes += 1
            recorded = read_pause(json.dumps(pause), now, self.control.clocks) if pause is not None else None
            self.control = replace(self.control, paused=recorded)
        return previous

    def _remember(self, writes: int, **fields: Any) -> None:
        """Keep what a step read; its pause only if this agent wrote none since the step began."""
        with self._control_lock:
            if writes != self._control_writes:
                fields.pop("paused", None)
            self.control = replace(self.control, **fields)

    def _read_control(self, now: float, writes: int, role: str) -> None:
        """Read the pause and the leader (`CoordinatorError` when they cannot be)."""
        paused, leader = self.coordinator.fleet_pause(), self.coordinator.leader_info()
        self._remember(writes, paused=paused, leader=leader, role=role, read_at=now, error=None)

    def _keep_control(self, now: float, writes: int, error: str) -> None:
        """The coordinator failed: the last pause seen holds (until its own expiry); the role is alone."""
        self._remember(writes, role="alone", error=error)

    def _lead(
        self,
        leadership: Leadership,
        now: float,
        mine: list[FleetEntry],
        since: float,
        settings: PlanSettings,
        extra_history: Sequence[RestartRecord],
        writes: int,
    ) -> Planned:
        fleet = _merge(mine, self.coordinator.fleet())
        history = [*self.coordinator.restarts(since), *extra_history]
        plan = planner.plan(fleet, history, self.limits, settings, now, self.windows)
        pause = self.coordinator.fleet_pause()
        seat = {"agent": self.agent_id, "revision": leadership.revision, "since": leadership.since}
        self._remember(writes, paused=pause, leader=seat, role="leader", read_at=now, error=None)
        paused = pause is not None
        grants: dict[str, list[PlannedGrant]] = defaultdict(list)
        for entry in plan.entries if not paused else ():
            if entry.agent != self.agent_id and entry.actionable:
                grants[entry.agent].append(_grant(entry, leadership.revision))
        written = self.coordinator.write_grants(leadership, grants)
        if paused:
            plan = Plan(computed_at=now, problems=plan.problems)
        return Planned(fleet, history, plan, role="leader", grants_written=written, leader=self.agent_id)

    def _follow(
        self,
        now: float,
        mine: list[FleetEntry],
        since: float,
        extra_history: Sequence[RestartRecord],
        writes: int,
    ) -> Planned:
        self._read_control(now, writes, "follower")
        seat = self.control.leader
        leader = seat.get("agent") if seat else None
        wanting = {e.instance: e for e in mine if e.wants_restart}
        if not wanting:
            return Planned(list(mine), [], Plan(computed_at=now), leader=leader)
        grants = self.coordinator.grants(self.agent_id)
        if grants is None:
            error = f"{self.coordinator.describe()}: this agent's grants cannot be read now; no restart until they can"
            return Planned(list(mine), [], Plan(computed_at=now), error)
        granted = {g.instance: g for g in grants if g.instance in wanting}
        entries = tuple(
            sorted((_entry(g, leader) for g in granted.values()), key=lambda e: (e.slot_at, e.instance))
        )
        fleet, history = list(mine), list(extra_history)
        if any(g.not_before <= now for g in granted.values()):  # the blockers and the budget need the fleet
            fleet = _merge(mine, self.coordinator.fleet())
            history = [*self.coordinator.restarts(since), *extra_history]
        return Planned(fleet, history, Plan(computed_at=now, entries=entries), leader=leader, granted=granted)


def _merge(mine: list[FleetEntry], fleet: list[FleetEntry]) -> list[FleetEntry]:
    names = {e.instance for e in mine}  # this agent's view of its own instances is the freshest
    return [*mine, *(e for e in fleet if e.instance not in names)]


def _grant(entry: PlanEntry, revision: int) -> PlannedGrant:
    return PlannedGrant(
        instance=entry.instance,
        fleet=entry.fleet,
        agent=entry.agent,
        slot_at=entry.slot_at,
        not_before=entry.slot_at,
        revision=revision,
        deadline=entry.deadline,
        latest_start=entry.latest_start,
        kind=entry.kind,
        finding_id=entry.finding_id,
        late=entry.late,
        after=entry.after,
        reason=entry.reason,
    )


def _entry(grant: PlannedGrant, leader: str | None) -> PlanEntry:
    slot = max(grant.slot_at, grant.not_before)
    reason = grant.reason or f"{grant.kind or 'restart'}: slot {at(slot)}"
    reason += f" [granted by the fleet's planner {leader or '?'}]"
    return PlanEntry(
        instance=grant.instance,
        fleet=grant.fleet,
        agent=grant.agent,
        slot_at=slot,
        latest_start=grant.latest_start,
        deadline=grant.deadline,
        kind=grant.kind,
        finding_id=grant.finding_id,
        late=grant.late,
        hopeless=False,
        reason=reason,
        after=grant.after,
    )


__all__ = ["ElectedPlanner", "FleetControl", "Planned"]
