"""The restart half of each step: the fleet planned, then each wanted restart in the order of its slot.

    this agent's instances published ─► plan (the elected planner; in dry-run alone, with its
    would-be restarts in the history and in the plan: `remediation.dry_run`) ─► per instance, past
    the engine's gate: a would-be restart already answered? ─► `Restarts.decide` (window, slot,
    blockers, mode, lock) ─► finished restarts recorded in their cases (`reap`)

A person hears when the coordinator stops answering and when it answers again, and when the set
of instances that cannot be saved in time changes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from agent.core.ports import EventSink
from remediation import dry_run
from remediation.config import RemediationSection
from remediation.coordinator import Coordinator
from remediation.fleet_view import history_window, local_entries
from remediation.grants import ElectedPlanner
from remediation.intake import Intake
from remediation.ledger import Ledger
from remediation.model import (
    Decision,
    FleetEntry,
    InstanceView,
    Intent,
    Plan,
    RemediationRequest,
    RestartRecord,
    StepReport,
    WouldRestart,
)
from remediation.planner import PlanSettings
from remediation.restarts import UNAVAILABLE, Restarts


class FleetRestarts:
    def __init__(
        self,
        config: RemediationSection,
        *,
        coordinator: Coordinator,
        planning: ElectedPlanner,
        restarts: Restarts,
        ledger: Ledger,
        intake: Intake,
        events: EventSink,
        agent_id: str,
        plan_settings: PlanSettings,
        mode: Callable[[], str],
    ) -> None:
        self.config = config
        self.coordinator = coordinator
        self.planning = planning
        self.restarts = restarts
        self.ledger = ledger
        self.intake = intake
        self.events = events
        self.agent_id = agent_id
        self.mode = mode
        self.plan_settings = plan_settings
        self.coordinator_error: str | None = None
        self._problems: tuple[tuple[str, str], ...] = ()
        self._stepped_at: float | None = None

    def settings(self, now: float) -> PlanSettings:
        """The plan settings of the step at `now`: the configured ones, with its length."""
        return replace(self.plan_settings, step=self._step_length(now))

    def _step_length(self, now: float) -> float:
        """How long after its latest safe start this step may be the first to reach a slot: the time
        since the previous step (the runtime adds jitter), at least `interval`, at most twice it."""
        interval = self.config.interval
        previous, self._stepped_at = self._stepped_at, now
        if previous is None or now <= previous:
            return interval
        return min(max(now - previous, interval), 2 * interval)

    def shared_view(
        self,
        now: float,
        views: Mapping[str, InstanceView],
        primary: Mapping[str, RemediationRequest],
        wanted: Mapping[str, Intent],
        report: StepReport,
        settings: PlanSettings,
        answered: Mapping[str, WouldRestart],
    ) -> tuple[list[FleetEntry], list[RestartRecord]]:
        """Publish, and plan: as the elected leader for the fleet, or from the leader's grants; in
        dry-run alone, with its would-be restarts in the history and in the plan (`remediation.dry_run`)."""

        def first_seen(instance: str, finding_id: str) -> float | None:
            case = self.ledger.case(instance, finding_id)
            return case.first_seen if case else None

        mine = local_entries(self.agent_id, views, primary, wanted, first_seen, now)
        since = now - history_window(self.config)
        in_dry_run = self.mode() == "dry-run"
        extra = self.ledger.would_restarts(since, self.agent_id) if in_dry_run else []
        planned = self.planning.step(
            now, mine, since, settings, dry_run=in_dry_run, extra_history=extra, skip=frozenset(answered)
        )
        report.plan = dry_run.with_would_be(
            planned.plan, answered, views, primary, wanted, self.agent_id, settings
        )
        self.note_coordinator(planned.error)
        report.coordinator_error = planned.error
        return planned.fleet, planned.history

    def restart(
        self,
        view: InstanceView,
        request: RemediationRequest,
        intent: Intent,
        report: StepReport,
        fleet: list[FleetEntry],
        history: list[RestartRecord],
        now: float,
    ) -> Decision:
        """One wanted restart, past the engine's gate."""
        entry = report.plan.entry(view.name)
        would = self.ledger.would_restart(view.name, view.start_time) if entry and entry.dry_run else None
        if would is not None:  # dry-run would already have restarted this process
            return dry_run.decision(would, request, view)
        action_id = self.intake.action_id(request)
        decision = self.restarts.decide(
            view, request, intent, report.plan, fleet, history, now, report.coordinator_error, action_id
        )
        if decision.code == UNAVAILABLE and not report.coordinator_error:
            self.note_coordinator(decision.reason)  # it failed at the lock itself
        elif decision.code == "started":
            report.started.append(view.name)
        elif decision.code == "dry-run":
            self.intake.done(view.name)
        return decision

    def note_coordinator(self, error: str | None) -> None:
        if error and error != self.coordinator_error:
            self.events.emit(
                "remediation_coordinator_unavailable",
                f"{error}; no restart will start until it answers",
                severity="error",
                coordinator=self.coordinator.describe(),
            )
        elif error is None and self.coordinator_error is not None:
            self.events.emit(
                "remediation_coordinator_recovered", f"{self.coordinator.describe()} answers again"
            )
        self.coordinator_error = error

    def report_plan_problems(self, plan: Plan) -> None:
        """One event per change of which instances cannot be saved in time (the problems' wording,
        with its times, changes every step; the instances concerned do not)."""
        problems = tuple(
            sorted(
                (e.instance, "hopeless" if e.hopeless else "late")
                for e in plan.entries
                if e.late or e.hopeless
            )
        )
        if plan.problems and problems != self._problems:
            self.events.emit(
                "remediation_plan_infeasible",
                f"{len(plan.problems)} restart(s) cannot meet their deadline: {plan.problems[0]}",
                severity="warning",
                problems=list(plan.problems),
            )
        self._problems = problems if plan.problems else ()

    def reap(self) -> None:
        """Record how finished restarts ended in their cases; drop one-shot requests carried out."""
        for execution in self.restarts.finished():
            request = execution.job.request
            if request is None:
                continue
            if execution.outcome in ("succeeded", "failed"):
                self.ledger.update_case(
                    execution.instance,
                    request.finding_id,
                    restarted_at=execution.finished_at,
                    restart_outcome=execution.outcome,
                    restart_deadline=request.deadline,
                    restart_finding=request.finding_id,
                )
            self.intake.done(execution.instance, request.finding_id)

    def describe_coordinator(self) -> dict[str, Any]:
        """The coordinator as the last step found it (`medic plan`'s `coordinator`)."""
        return {
            "backend": self.coordinator.describe(),
            "ok": self.coordinator_error is None,
            "error": self.coordinator_error,
        }


def slot_order(plan: Plan, name: str) -> tuple[float, str]:
    """The sort key that takes wanted restarts in the order of their slots."""
    entry = plan.entry(name)
    return (entry.slot_at if entry else math.inf, name)
