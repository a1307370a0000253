"""The remediation engine: each `step(now, requests, instances)` turns findings into decisions.

    requests ─► intake (valid? about the process that runs now?) ─► case ─► ladder (policy.decide)
        purge / escalate ─► ladder_actions (no fleet slot)
        restart ─► publish this agent's instances, read everyone's (fleet_view)
                ─► plan the whole fleet (planner; every agent derives the same plan)
                ─► pause → exclude ─► restarts: window → slot reached? → blockers → mode
                ─► lock (coordinator slot, budget checked atomically) ─► Execution thread:
                   evidence → drain → act → verify → release

Every instance with a request ends the step with one Decision (stage, code, reason); the ledger
keeps it when it changes, the action of a person's request says whether it is held and why, and
the event log says what a person needs to know. Dry-run walks the same path and stops before the
lock, recording once per process the restart it would make (`remediation.dry_run`): the process
still runs and is judged as it is, and the other instances are planned as enforce would plan them
after that restart. The pause (the kill
switch, `remediation.pause`) holds in memory at once, even when the ledger cannot be written; the
fleet-wide pause (`pause_fleet`) lives in the coordinator, and every agent of the namespace holds
while it lasts (read each step, with the leader, by the elected planner).

The engine sees the agent only through ports (`agent.core.ports`): an event sink, a table store
for its ledger, and the hooks (`remediation.hooks`) that find and act on processes.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.core.ports import EventSink, TableStore
from remediation import dry_run, planner, policy
from remediation.budget import HOUR
from remediation.config import RemediationSection
from remediation.coordinator import Coordinator, create_coordinator
from remediation.coordinator.base import fleet_pause_decision
from remediation.errors import CoordinatorError, NotShared
from remediation.fleet_view import history_window, local_entries
from remediation.grants import ElectedPlanner
from remediation.hooks import EngineHooks, PurgeFn
from remediation.intake import DB_ERRORS, SUBMITTED_TTL, Intake
from remediation.ladder_actions import LadderActions
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
)
from remediation.pause import KillSwitch, pause_decision
from remediation.restarts import UNAVAILABLE, Restarts
from remediation.text import at

log = logging.getLogger("medic.remediation")


class Engine:
    def __init__(
        self,
        config: RemediationSection,
        *,
        store: TableStore,
        events: EventSink,
        coordinator: Coordinator,
        agent_id: str,
        state_dir: Path,
        hooks: EngineHooks | None = None,
        background: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.events = events
        self.coordinator = coordinator
        self.agent_id = agent_id
        self.hooks = hooks or EngineHooks()
        self.background = background
        self.clock = clock
        self.state_dir = Path(state_dir)
        self.ledger = Ledger(store)
        self.limits = config.limits()
        self.plan_settings = config.plan_settings()
        self.ladder = config.ladder_settings()
        self.windows = config.time_windows()
        self.grace = max(5 * config.interval, 60.0)  # a finding not reported this long has cleared
        self._lock = threading.RLock()  # one step at a time
        self.switch = KillSwitch(self.ledger, events, clock)
        self._store_error: str | None = None
        self._stop = threading.Event()
        self.intake = Intake(
            self.ledger, events, clear_check=self.ladder.clear_check, grace=self.grace, clock=clock
        )
        self.actions = LadderActions(
            self.ledger,
            events,
            self.hooks,
            reset_after=self.ladder.crash_loop_reset_after,
            mode=lambda: self.mode,
            expiry=config.ladder.escalation_expiry,
            clock=clock,
        )
        self.restarts = Restarts(
            config,
            coordinator=coordinator,
            ledger=self.ledger,
            events=events,
            agent_id=agent_id,
            hooks=self.hooks,
            evidence_dir=config.evidence.dir or (Path(state_dir) / "evidence"),
            stop=self._stop,
            clock=clock,
            paused=self._held,
        )
        self._owns_coordinator = False
        self._coordinator_error: str | None = None
        self._problems: tuple[tuple[str, str], ...] = ()
        self._pruned_at = -math.inf
        self._stepped_at: float | None = None
        self.last: StepReport | None = None
        self._fleet_seen: dict[str, Any] | None = None  # the fleet pause the last step saw
        self.planning = ElectedPlanner(
            coordinator,
            agent_id,
            limits=self.limits,
            windows=self.windows,
            leader_ttl=config.coordinator.lease_ttl,
            fleet_ttl=config.coordinator.fleet_ttl,
        )
        for action in self.ledger.interrupt_unfinished(clock()):
            events.emit(
                "remediation_interrupted",
                f"action {action['id']} ({action['action']}) was cut short by an agent restart",
                instance=action["instance"],
                severity="warning",
                action_id=action["id"],
            )

    @classmethod
    def from_config(
        cls,
        config: RemediationSection,
        *,
        store: TableStore,
        events: EventSink,
        agent_id: str,
        state_dir: Path,
        hooks: EngineHooks | None = None,
        **kwargs: Any,
    ) -> Engine:
        """Build the engine and its configured coordinator (raises `RemediationError` with what to fix)."""
        coordinator = create_coordinator(
            config.coordinator, state_dir=state_dir, retention=history_window(config)
        )
        engine = cls(
            config,
            store=store,
            events=events,
            coordinator=coordinator,
            agent_id=agent_id,
            hooks=hooks,
            state_dir=state_dir,
            **kwargs,
        )
        engine._owns_coordinator = True
        return engine

    # ----------------------------------------------------------------------------- operator controls
    @property
    def mode(self) -> str:
        return self.config.mode

    def pause(self, reason: str, until: float, by: str | None = None) -> dict[str, Any]:
        """The kill switch: nothing is purged or restarted until `until` (unix time) or `resume()`.

        It holds in memory at once; `pause_storage()` says whether it is also in the ledger yet.
        """
        return self.switch.pause(reason, until, by)

    def resume(self, by: str | None = None) -> dict[str, Any] | None:
        return self.switch.resume(by)

    def paused(self, now: float) -> dict[str, Any] | None:
        """The pause in force at `now` (from memory: no store read); an expired one is lifted."""
        return self.switch.paused(now)

    def pause_storage(self) -> dict[str, Any]:
        """`{"persisted": True}`, or False with a warning that says what holds and what is retried."""
        return self.switch.storage()

    def pause_fleet(self, reason: str, until: float, by: str | None = None) -> dict[str, Any]:
        """The fleet-wide kill switch: no agent of the namespace purges or restarts anything until
        `until` or `resume_fleet()`. Written to the coordinator at once; `NotShared` when this
        agent's coordinator is its own, `CoordinatorError` when it cannot be written (nothing
        paused then), ValueError without a reason or a future expiry."""
        self._check_shared()
        now = self.clock()
        if not reason or not reason.strip():
            raise ValueError("a pause needs a reason (who is doing what, for how long)")
        if not math.isfinite(until) or until <= now:
            raise ValueError("a pause needs an expiry in the future")
        record = {"reason": reason.strip(), "until": until, "by": by, "since": now, "agent": self.agent_id}
        self.planning.set_fleet_pause(record, now)
        paused = self.planning.control.pause_at(now) or record
        self._fleet_seen = paused
        self.events.emit(
            "remediation_paused",
            f"remediation paused fleet-wide ({self.coordinator.describe()}) until {at(until)} "
            f"by {by or 'an operator'}: {paused['reason']}",
            severity="warning",
            scope="fleet",
            **paused,
        )
        return paused

    def resume_fleet(self, by: str | None = None) -> dict[str, Any] | None:
        """Lift the fleet-wide pause; returns the one lifted, or None when there was none (same
        errors as `pause_fleet`)."""
        self._check_shared()
        previous = self.planning.set_fleet_pause(None, self.clock())
        self._fleet_seen = None
        if previous is not None:
            self.events.emit(
                "remediation_resumed",
                f"remediation resumed fleet-wide ({self.coordinator.describe()}) by {by or 'an operator'}; "
                f"the pause was: {previous.get('reason')}",
                scope="fleet",
                by=by,
                previous=previous,
            )
        return previous

    def fleet_paused(self, now: float) -> dict[str, Any] | None:
        """The fleet-wide pause in force at `now`, as the last step read it (no coordinator request)."""
        return self.planning.control.pause_at(now)

    def shared(self) -> str | None:
        """None when the coordinator is shared with other agents (etcd, or a local file named in
        the config); else why not."""
        path = getattr(self.coordinator, "path", None)
        if self.coordinator.name != "local" or path is None:
            return None
        if Path(path).resolve() != (self.state_dir / "coordinator.db").resolve():
            return None
        return (
            f"this agent has no shared coordinator: its coordinator is the SQLite file {path} in its own "
            "state directory, which no other agent uses, so a fleet-wide pause would hold only this agent; "
            "use `medic pause` (without --fleet), or share one coordinator between the agents "
            "(remediation.coordinator.local.path on one host, backend: etcd across hosts)"
        )

    def _check_shared(self) -> None:
        why = self.shared()
        if why is not None:
            raise NotShared(why)

    def _held(self, now: float) -> dict[str, Any] | None:
        """The pause that holds at `now`, this agent's own or the fleet's (checked before acting)."""
        return self.paused(now) or self.fleet_paused(now)

    def submit(self, request: RemediationRequest) -> Decision:
        """A one-shot request (a person's restart): kept until carried out or `SUBMITTED_TTL` passes,
        with its action in the ledger from now on (`data.action_id`)."""
        if self.mode == "off":
            return Decision.block(
                "mode",
                "off",
                "remediation is off (remediation.mode: off): nothing would carry the restart out; set "
                "mode: enforce to restart, or dry-run to see what would be done",
            )
        decision = self.intake.submit(request, self.mode)
        if not decision.ok:
            return decision
        action_id = decision.data["action_id"]
        held = self._pause_gate(self.clock())
        if held is not None:  # kept, but nothing happens before the pause ends
            lift = "`medic resume --fleet`" if held.data.get("scope") == "fleet" else "`medic resume`"
            return Decision.allow(  # accepted, and kept
                "pause",
                f"request held: {held.reason}; it goes through the {self.mode} "
                f"pipeline after {lift} or when the pause expires (dropped if still paused "
                f"{SUBMITTED_TTL / 60:g} min after it was made)",
                code="held",
                action_id=action_id,
            )
        return Decision.allow(
            "check", f"request accepted; it goes through the {self.mode} pipeline", action_id=action_id
        )

    def clear_escalation(self, instance: str, by: str | None = None) -> bool:
        """A person looked: automatic remediation of `instance` may act again (crash-loop count reset too)."""
        return self.actions.clear(instance, by)

    # ----------------------------------------------------------------------------- the step
    def step(
        self, now: float, requests: Iterable[RemediationRequest] = (), instances: Iterable[InstanceView] = ()
    ) -> StepReport:
        self.switch.retry()
        with self._lock:
            try:
                report = self._step(now, requests, {v.name: v for v in instances})
                self.last = report  # whole: `snapshot` never shows a step half made
                self._store_error = None
            except DB_ERRORS as exc:  # disk full: a step that cannot record starts nothing more
                if str(exc) != self._store_error:
                    log.error("remediation step cut short: the state database cannot be written: %s", exc)
                self._store_error = str(exc)
                report = self.last or StepReport(now=now, mode=self.mode, plan=Plan(computed_at=now))
        if not self.background:
            self.restarts.wait()
            with self._lock:
                self._reap()
        return report

    def _step(
        self, now: float, requests: Iterable[RemediationRequest], views: Mapping[str, InstanceView]
    ) -> StepReport:
        self._reap()
        report = StepReport(now=now, mode=self.mode, plan=Plan(computed_at=now))
        if self.mode == "off":
            return report
        for view in views.values():
            if view.start_time is not None:
                self.ledger.record_start(view.name, view.start_time, now)
        primary, stale = self.intake.take(now, requests, views)
        report.decisions.update(stale)
        self.actions.expire(primary, now, self.grace)
        for name, request in primary.items():
            report.intents[name] = self._intent(request, views[name], now)
        for name, intent in report.intents.items():
            if intent.action in ("purge", "escalate"):
                act = self._purge if intent.action == "purge" else self.actions.escalate
                report.decisions[name] = self._guard(name, act, views[name], primary[name], intent, now)
            elif intent.action != "restart":
                report.decisions[name] = Decision.block("policy", intent.code, intent.reason)
        wanted = {n: i for n, i in report.intents.items() if i.action == "restart"}
        settings = replace(self.plan_settings, step=self._step_length(now))
        answered = dry_run.answered(self.ledger, wanted, views, primary) if self.mode == "dry-run" else {}
        fleet, history = self._shared_view(now, views, primary, wanted, report, settings, answered)
        self._report_plan_problems(report.plan)
        for name in sorted(wanted, key=lambda n: _slot(report.plan, n)):
            report.decisions[name] = self._guard(
                name, self._restart, views[name], primary[name], wanted[name], report, fleet, history, now
            )
        for name, decision in report.decisions.items():
            self.ledger.record_decision(name, decision, now)
        self.intake.note(report.decisions)
        if now - self._pruned_at >= HOUR:
            self.ledger.prune(now, self.config.retention)
            self._pruned_at = now
        return report

    def _step_length(self, now: float) -> float:
        """How long after its latest safe start this step may be the first to reach a slot: the time
        since the previous step (the runtime adds jitter), at least `interval`, at most twice it."""
        interval = self.config.interval
        previous, self._stepped_at = self._stepped_at, now
        if previous is None or now <= previous:
            return interval
        return min(max(now - previous, interval), 2 * interval)

    def _guard(self, name: str, fn: Callable[..., Decision], *args: Any) -> Decision:
        """One instance's unexpected failure becomes its decision; the other instances carry on."""
        try:
            return fn(*args)
        except Exception as exc:
            log.exception("remediation of %s failed", name)
            return Decision.block(
                "internal", "error", f"internal error, nothing done: {exc.__class__.__name__}: {exc}"
            )

    def _intent(self, request: RemediationRequest, view: InstanceView, now: float) -> Intent:
        try:
            if view.name in self.restarts.executions:
                return Intent("wait", "in-progress", "a restart of this instance is in progress")
            held = None if request.force else self.actions.held(view, now)
            if held is not None:
                return held
            case = self.ledger.case(view.name, request.finding_id)
            assert case is not None  # the intake just touched it
            loop = self.ladder
            starts = self.ledger.starts(view.name, now - loop.crash_loop_window - loop.crash_loop_reset_after)
            can_purge = self.actions.can_purge(view)
            return policy.decide(
                request, case, starts, loop, now, can_purge=can_purge, plan=self.plan_settings
            )
        except Exception as exc:
            log.exception("the ladder failed for %s", view.name)
            return Intent("none", "error", f"internal error, nothing done: {exc}")

    def _pause_gate(self, now: float) -> Decision | None:
        """This agent's pause, else the fleet's: the decision while one holds."""
        pause = self.paused(now)
        if pause is not None:
            return pause_decision(pause)
        fleet = self.fleet_paused(now)
        return fleet_pause_decision(fleet) if fleet is not None else None

    def _gate(self, view: InstanceView, now: float) -> Decision | None:
        """The kill switches and the exclusion list: no action on the instance at all."""
        paused = self._pause_gate(now)
        if paused is not None:
            return paused
        if self.config.excluded(view.name):
            return Decision.block(
                "exclude", "excluded", f"{view.name} is excluded from remediation in the config"
            )
        return None

    def _purge(self, view: InstanceView, request: RemediationRequest, intent: Intent, now: float) -> Decision:
        gate = self._gate(view, now)
        return gate if gate is not None else self.actions.purge(view, request, intent, now)

    def _restart(
        self,
        view: InstanceView,
        request: RemediationRequest,
        intent: Intent,
        report: StepReport,
        fleet: list[FleetEntry],
        history: list[RestartRecord],
        now: float,
    ) -> Decision:
        gate = self._gate(view, now)
        if gate is not None:
            return gate
        entry = report.plan.entry(view.name)
        would = self.ledger.would_restart(view.name, view.start_time) if entry and entry.dry_run else None
        if would is not None:  # dry-run would already have restarted this process
            return dry_run.decision(would, request, view)
        action_id = self.intake.action_id(request)
        decision = self.restarts.decide(
            view, request, intent, report.plan, fleet, history, now, report.coordinator_error, action_id
        )
        if decision.code == UNAVAILABLE and not report.coordinator_error:
            self._note_coordinator(decision.reason)  # it failed at the lock itself
        elif decision.code == "started":
            report.started.append(view.name)
        elif decision.code == "dry-run":
            self.intake.done(view.name)
        return decision

    # ----------------------------------------------------------------------------- the fleet view
    def _shared_view(
        self,
        now: float,
        views: Mapping[str, InstanceView],
        primary: Mapping[str, RemediationRequest],
        wanted: Mapping[str, Intent],
        report: StepReport,
        settings: planner.PlanSettings,
        answered: Mapping[str, dry_run.WouldRestart],
    ) -> tuple[list[FleetEntry], list[RestartRecord]]:
        """Publish, and plan: as the elected leader for the fleet, or from the leader's grants; in
        dry-run alone, with its would-be restarts in the history and in the plan (`remediation.dry_run`)."""

        def first_seen(instance: str, finding_id: str) -> float | None:
            case = self.ledger.case(instance, finding_id)
            return case.first_seen if case else None

        mine = local_entries(self.agent_id, views, primary, wanted, first_seen, now)
        since = now - history_window(self.config)
        in_dry_run = self.mode == "dry-run"
        extra = self.ledger.would_restarts(since, self.agent_id) if in_dry_run else []
        planned = self.planning.step(
            now, mine, since, settings, dry_run=in_dry_run, extra_history=extra, skip=frozenset(answered)
        )
        report.plan = dry_run.with_would_be(
            planned.plan, answered, views, primary, wanted, self.agent_id, settings
        )
        self._note_coordinator(planned.error)
        report.coordinator_error = planned.error
        self._note_fleet_pause(now)
        return planned.fleet, planned.history

    def _note_fleet_pause(self, now: float) -> None:
        """The agent that set the fleet pause says when it expired (the others only hold, and say
        so in their decisions)."""
        seen, self._fleet_seen = self._fleet_seen, self.fleet_paused(now)
        until = seen.get("until") if seen else None
        if seen is None or self._fleet_seen is not None or seen.get("agent") != self.agent_id:
            return
        if until is not None and until <= now:
            self.events.emit(
                "remediation_resumed",
                f"the fleet-wide pause ({seen.get('reason')}) expired",
                scope="fleet",
                **seen,
            )

    def _note_coordinator(self, error: str | None) -> None:
        if error and error != self._coordinator_error:
            self.events.emit(
                "remediation_coordinator_unavailable",
                f"{error}; no restart will start until it answers",
                severity="error",
                coordinator=self.coordinator.describe(),
            )
        elif error is None and self._coordinator_error is not None:
            self.events.emit(
                "remediation_coordinator_recovered", f"{self.coordinator.describe()} answers again"
            )
        self._coordinator_error = error

    def _report_plan_problems(self, plan: Plan) -> None:
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

    def _reap(self) -> None:
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

    # ----------------------------------------------------------------------------- views and shutdown
    def in_progress(self) -> list[str]:
        """Instances being restarted now (read without waiting for a running step)."""
        return sorted(list(self.restarts.executions))

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """What `/api/v1/plan` and `medic plan` show: mode, pause, the fleet's pause and planner,
        the plan, decisions, restarts in flight. Reads no coordinator: the fleet's controls are as
        the last step read them (`fleet.read_at`)."""
        now = self.clock() if now is None else now
        last = self.last
        control = self.planning.control
        leader = control.leader
        return {
            "mode": self.mode,
            "agent": self.agent_id,
            "paused": self.paused(now),
            "pause_persisted": self.pause_storage()["persisted"],
            "fleet": {
                "namespace": self.config.coordinator.namespace,
                "shared": self.shared() is None,
                "paused": control.pause_at(now),
                "leader": dict(leader) if leader else None,
                "leads": bool(leader and leader.get("agent") == self.agent_id),
                "role": control.role,
                "read_at": control.read_at,
                "error": control.error,
            },
            "coordinator": {
                "backend": self.coordinator.describe(),
                "ok": self._coordinator_error is None,
                "error": self._coordinator_error,
            },
            "budget": {
                "max_concurrent": self.limits.max_concurrent,
                "min_interval": self.limits.min_interval,
                "max_per_hour": self.limits.max_per_hour,
                "cooldown": self.limits.cooldown,
                "text": self.limits.describe(),
            },
            "windows": self.windows.describe(),
            "escalations": [
                {**e, "expires_at": self.actions.expires_at(e), "hold": self.actions.hold_reason(e)}
                for e in self.ledger.escalations()
            ],
            "requests": [p.to_dict() for p in self.intake.pending()],
            "in_progress": self.in_progress(),
            "restarts_in_flight": self.restarts.describe(),
            "step": last.to_dict() if last else None,
            "age_seconds": (now - last.now) if last else None,
        }

    def close(self, timeout: float = 10.0) -> None:
        """Stop: running restarts are told to stop waiting; their slots are released (or expire)."""
        self._stop.set()
        self.restarts.wait(timeout)
        with self._lock:
            self._reap()
        try:
            self.coordinator.resign()  # a successor need not wait for the leader key's TTL
        except CoordinatorError as exc:
            log.info("could not resign the fleet's leadership (it expires by itself): %s", exc)
        if self._owns_coordinator:
            self.coordinator.close()


def _slot(plan: Plan, name: str) -> tuple[float, str]:
    entry = plan.entry(name)
    return (entry.slot_at if entry else math.inf, name)


__all__ = ["SUBMITTED_TTL", "Engine", "EngineHooks", "PurgeFn", "StepReport", "history_window"]
