"""The remediation engine: each `step(now, requests, instances)` turns findings into decisions.

    requests ─► intake (valid? about the process that runs now?) ─► case ─► ladder (policy.decide)
        purge / escalate ─► ladder_actions (no fleet slot)
        restart ─► publish this agent's instances, read everyone's (fleet_view)
                ─► plan the whole fleet (planner; every agent derives the same plan)
                ─► pause → exclude ─► restarts: window → slot reached? → blockers → mode
                ─► lock (coordinator slot, budget checked atomically) ─► Execution thread:
                   evidence → drain → act → verify → release
        (the restart half of the step: `remediation.fleet_restarts`)

Every instance with a request ends the step with one Decision (stage, code, reason); the ledger
keeps it when it changes, the action of a person's request says whether it is held and why, and
the event log says what a person needs to know. Dry-run walks the same path and stops before the
lock, recording once per process the restart it would make (`remediation.dry_run`): the process
still runs and is judged as it is, and the other instances are planned as enforce would plan them
after that restart. The pause (the kill
switch, `remediation.pause`) holds in memory at once, even when the ledger cannot be written; the
fleet-wide pause (`remediation.fleet_pause`) lives in the coordinator, and every agent of the
namespace holds while it lasts.

The engine sees the agent only through ports (`agent.core.ports`): an event sink, a table store
for its ledger, and the hooks (`remediation.hooks`) that find and act on processes.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from agent.core.ports import EventSink, TableStore
from remediation import dry_run, policy
from remediation.budget import HOUR
from remediation.config import RemediationSection
from remediation.coordinator import Coordinator, create_coordinator
from remediation.coordinator.base import fleet_pause_decision
from remediation.errors import CoordinatorError
from remediation.fleet_pause import FleetPause
from remediation.fleet_restarts import FleetRestarts, slot_order
from remediation.fleet_view import history_window
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
from remediation.restarts import Restarts

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
        self._pruned_at = -math.inf
        self.last: StepReport | None = None
        self.planning = ElectedPlanner(
            coordinator,
            agent_id,
            limits=self.limits,
            windows=self.windows,
            leader_ttl=config.coordinator.lease_ttl,
            fleet_ttl=config.coordinator.fleet_ttl,
        )
        self.fleet_pause = FleetPause(
            coordinator, self.planning, events, agent_id=agent_id, state_dir=self.state_dir, clock=clock
        )
        self.fleet_restarts = FleetRestarts(
            config,
            coordinator=coordinator,
            planning=self.planning,
            restarts=self.restarts,
            ledger=self.ledger,
            intake=self.intake,
            events=events,
            agent_id=agent_id,
            plan_settings=self.plan_settings,
            mode=lambda: self.mode,
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
        """The fleet-wide kill switch (`FleetPause.pause`)."""
        return self.fleet_pause.pause(reason, until, by)

    def resume_fleet(self, by: str | None = None) -> dict[str, Any] | None:
        """Lift the fleet-wide pause (`FleetPause.resume`)."""
        return self.fleet_pause.resume(by)

    def _held(self, now: float) -> dict[str, Any] | None:
        """The pause that holds at `now`, this agent's own or the fleet's (checked before acting)."""
        return self.paused(now) or self.fleet_pause.at(now)

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
                self.fleet_restarts.reap()
        return report

    def _step(
        self, now: float, requests: Iterable[RemediationRequest], views: Mapping[str, InstanceView]
    ) -> StepReport:
        self.fleet_restarts.reap()
        report = StepReport(now=now, mode=self.mode, plan=Plan(computed_at=now))
        if self.mode == "off":
            return report
        for view in views.values():
            if view.start_time is not None:
                self.ledger.record_start(view.name, view.start_time, now)
        primary, stale, considered = self.intake.take(now, requests, views)
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
        settings = self.fleet_restarts.settings(now)
        answered = dry_run.answered(self.ledger, wanted, views, primary) if self.mode == "dry-run" else {}
        fleet, history = self.fleet_restarts.shared_view(
            now, views, primary, wanted, report, settings, answered
        )
        self.fleet_pause.note_expiry(now)
        self.fleet_restarts.report_plan_problems(report.plan)
        for name in sorted(wanted, key=lambda n: slot_order(report.plan, n)):
            report.decisions[name] = self._guard(
                name, self._restart, views[name], primary[name], wanted[name], report, fleet, history, now
            )
        for name, decision in report.decisions.items():
            self.ledger.record_decision(name, decision, now)
        self.intake.note(report.decisions, considered)
        if now - self._pruned_at >= HOUR:
            self.ledger.prune(now, self.config.retention)
            self._pruned_at = now
        return report

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
        fleet = self.fleet_pause.at(now)
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
        return (
            gate
            if gate is not None
            else self.fleet_restarts.restart(view, request, intent, report, fleet, history, now)
        )

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
        return {
            "mode": self.mode,
            "agent": self.agent_id,
            "paused": self.paused(now),
            "pause_persisted": self.pause_storage()["persisted"],
            "fleet": self.fleet_pause.describe(now, self.config.coordinator.namespace),
            "coordinator": self.fleet_restarts.describe_coordinator(),
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
            self.fleet_restarts.reap()
        try:
            self.coordinator.resign()  # a successor need not wait for the leader key's TTL
        except CoordinatorError as exc:
            log.info("could not resign the fleet's leadership (it expires by itself): %s", exc)
        if self._owns_coordinator:
            self.coordinator.close()


__all__ = ["SUBMITTED_TTL", "Engine", "EngineHooks", "PurgeFn", "StepReport", "history_window"]
