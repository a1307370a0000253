"""The restart half of the pipeline, once the ladder wants a restart and the plan is known:

    window → slot reached? → blockers → (dry-run: budget, record, stop) → lock → Execution thread

The engine applies the pause and the exclusion list before calling `decide`; everything after the
lock (evidence → drain → act → verify → release) runs in an `Execution`. A forced manual request
skips the window, the plan, the blockers and the budget, but still takes a coordinator slot so that
the other agents see it. A person's request already has its action in the ledger (opened when it
was asked): the restart, or dry-run's would-be restart, is recorded in that same action.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agent.core.ports import EventSink
from remediation.actuators import Actuator, ActuatorHooks, create_actuator
from remediation.blockers import (
    Blocker,
    BlockerContext,
    CapacityFloor,
    MinUptime,
    PrometheusAlerts,
    TimeWindowGate,
)
from remediation.budget import BudgetState, admit
from remediation.config import RemediationSection
from remediation.coordinator import Coordinator, Grant, SlotRequest
from remediation.drain import Drain
from remediation.errors import ActuatorError, CoordinatorError
from remediation.evidence import EvidenceStore
from remediation.execution import Execution, RestartJob
from remediation.hooks import EngineHooks
from remediation.ledger import Ledger
from remediation.model import (
    WOULD_RESTART,
    Decision,
    FleetEntry,
    InstanceView,
    Intent,
    Plan,
    PlanEntry,
    RemediationRequest,
    RestartRecord,
)
from remediation.verify import Verifier

Admit = Callable[[Sequence[RestartRecord], float], Decision]
UNAVAILABLE = "coordinator-unavailable"


class Restarts:
    def __init__(
        self,
        config: RemediationSection,
        *,
        coordinator: Coordinator,
        ledger: Ledger,
        events: EventSink,
        agent_id: str,
        hooks: EngineHooks,
        evidence_dir: Path,
        stop: Any,
        clock: Callable[[], float] = time.time,
        paused: Callable[[float], object] = lambda now: None,
    ) -> None:
        self.config = config
        self.paused = paused
        self.coordinator = coordinator
        self.ledger = ledger
        self.events = events
        self.agent_id = agent_id
        self.hooks = hooks
        self.stop = stop
        self.clock = clock
        self.limits = config.limits()
        self.settings = config.plan_settings()
        self.window_gate = TimeWindowGate(config.time_windows())
        self.blockers = self._blockers()
        e = config.evidence
        self.evidence = (
            EvidenceStore(evidence_dir, keep=e.keep, max_bytes=e.max_bytes, timeout=e.timeout)
            if e.enabled
            else None
        )
        self.executions: dict[str, Execution] = {}

    def _blockers(self) -> list[Blocker]:
        b = self.config.blockers
        found: list[Blocker] = [
            MinUptime(b.min_uptime),
            CapacityFloor(b.capacity.max_unavailable, b.capacity.min_ready_fraction),
        ]
        if b.prometheus is not None:
            p = b.prometheus
            found.append(PrometheusAlerts(p.url, p.match, p.ignore, p.timeout))
        return [*found, *self.hooks.blockers]

    # ----------------------------------------------------------------------------- deciding
    def decide(
        self,
        view: InstanceView,
        request: RemediationRequest,
        intent: Intent,
        plan: Plan,
        fleet: list[FleetEntry],
        history: list[RestartRecord],
        now: float,
        coordinator_error: str | None,
        action_id: int | None = None,
    ) -> Decision:
        """The restart's verdict at `now`; `action_id`: the action a person's request opened."""
        ctx = BlockerContext(view=view, now=now, fleet=fleet, in_flight=[r for r in history if r.in_flight])
        entry = plan.entry(view.name)
        if not request.force:
            window = self.window_gate.check(ctx)
            if not window.ok:
                return window
            if entry is None:
                return Decision.block(
                    "plan", "not-planned", "not in the plan yet (already in flight elsewhere?)"
                )
            if entry.hopeless:
                return Decision.block("plan", "cannot-save", entry.reason, slot_at=entry.slot_at)
            if entry.slot_at > now:
                return _waiting(entry)
            for blocker in self.blockers:
                decision = blocker.check(ctx)
                if not decision.ok:
                    return decision
        if coordinator_error:
            return Decision.block(
                "lock", UNAVAILABLE, f"{coordinator_error}; no restart without the coordinator"
            )
        check = self._admit_for(view, request)
        if self.config.mode == "dry-run":
            decision = check(history, now)
            return (
                decision if not decision.ok else self._dry_run(view, request, intent, entry, now, action_id)
            )
        try:
            actuator = self._actuator(view)
        except ActuatorError as exc:
            return Decision.block("act", "no-actuator", str(exc))
        slot = SlotRequest(view.name, view.fleet, self.agent_id, self.config.coordinator.lease_ttl)
        try:
            result = self.coordinator.acquire(slot, check)
        except CoordinatorError as exc:
            return Decision.block("lock", UNAVAILABLE, f"{exc}; no restart without the coordinator")
        if result.grant is None:
            return result.decision
        return self._start(view, request, intent, entry, actuator, result.grant, now, action_id)

    def _admit_for(self, view: InstanceView, request: RemediationRequest) -> Admit:
        if request.force:
            return lambda records, now: Decision.allow("budget", "forced: the budget is bypassed (logged)")

        def check(records: Sequence[RestartRecord], now: float) -> Decision:
            state = BudgetState(records, now=now, assumed_duration=self.settings.restart_duration)
            return admit(state, view.fleet, view.name, now, self.limits)

        return check

    def _dry_run(
        self,
        view: InstanceView,
        request: RemediationRequest,
        intent: Intent,
        entry: PlanEntry | None,
        now: float,
        action_id: int | None,
    ) -> Decision:
        """Record, once for this process, the restart dry-run mode would do now (`remediation.dry_run`)."""
        fields: dict[str, Any] = {
            "mode": "dry-run",
            "reason": intent.reason,
            "outcome": WOULD_RESTART,
            "started_at": now,
            "finished_at": now + self.settings.restart_duration,
            "slot_at": entry.slot_at if entry else now,
            "fleet": view.fleet,
            "old_pid": view.pid,
            "old_start_time": view.start_time,
            "detail": "dry-run: nothing was restarted; the process runs on",
        }
        action_id = self._record(view, request, action_id, now, fields)
        self.events.emit(
            "remediation_dry_run",
            f"dry-run: would restart now: {intent.reason}",
            instance=view.name,
            finding_id=request.finding_id,
            action_id=action_id,
        )
        return Decision.allow(
            "act",
            f"dry-run: would restart now (action {action_id}; nothing is restarted): {intent.reason}",
            code="dry-run",
            action_id=action_id,
            would_restart_at=now,
        )

    def _record(
        self,
        view: InstanceView,
        request: RemediationRequest,
        action_id: int | None,
        now: float,
        fields: dict[str, Any],
    ) -> int:
        """Write a restart into the action a person's request opened, else into a new one."""
        if action_id is None:
            return self.ledger.open_action(
                instance=view.name, action="restart", now=now, request=request, **fields
            )
        self.ledger.update_action(action_id, **fields)
        return action_id

    def _actuator(self, view: InstanceView) -> Actuator:
        spec = self.config.for_instance(view.name).actuator or self.config.actuator
        hooks = ActuatorHooks(locate=self.hooks.locate, managed_restart=self.hooks.managed_restart)
        return create_actuator(spec, view, hooks)

    def _verifier(self, view: InstanceView) -> Verifier:
        section = self.config.for_instance(view.name).verify or self.config.verify
        return Verifier(
            self.hooks.locate or (lambda name: None),
            timeout=section.timeout,
            stable_for=section.stable_for,
            health_url=section.health_url,
            warmup_gate=self.hooks.warmup_gate if section.warmup is not None else None,
            on_cold=section.warmup.on_cold if section.warmup is not None else "escalate",
        )

    # ----------------------------------------------------------------------------- executing
    def _start(
        self,
        view: InstanceView,
        request: RemediationRequest,
        intent: Intent,
        entry: PlanEntry | None,
        actuator: Actuator,
        grant: Grant,
        now: float,
        action_id: int | None,
    ) -> Decision:
        drain = self.config.for_instance(view.name).drain or self.config.drain
        fields: dict[str, Any] = {
            "mode": self.config.mode,
            "reason": intent.reason,
            "outcome": "running",
            "started_at": grant.started_at,
            "slot_at": entry.slot_at if entry else now,
            "fleet": view.fleet,
            "actuator": actuator.kind,
            "old_pid": view.pid,
            "old_start_time": view.start_time,
            "holder": self.agent_id,
            "token": grant.token,
            "detail": "",
        }
        action_id = self._record(view, request, action_id, now, fields)
        job = RestartJob(
            action_id=action_id,
            view=view,
            request=request,
            grant=grant,
            actuator=actuator,
            verifier=self._verifier(view),
            drain=Drain(drain) if drain else None,
            evidence=self.evidence,
            captures=self.hooks.captures,
            act_timeout=self.settings.restart_duration + 60.0,
        )
        execution = Execution(
            job,
            coordinator=self.coordinator,
            ledger=self.ledger,
            events=self.events,
            stop=self.stop,
            clock=self.clock,
            paused=self.paused,
        )
        self.executions[view.name] = execution
        self.events.emit(
            "remediation_restart_started",
            f"restarting ({actuator.kind}): {intent.reason}",
            instance=view.name,
            severity="warning",
            action_id=action_id,
            finding_id=request.finding_id,
            forced=request.force,
            old_pid=view.pid,
        )
        execution.start()
        return Decision.allow("act", f"restart started (action {action_id}): {intent.reason}", code="started")

    def describe(self) -> list[dict[str, Any]]:
        """The restarts running now: which action, since when, at which stage (`medic plan`)."""
        return [
            {
                "instance": e.instance,
                "action_id": e.job.action_id,
                "started_at": e.started_at,
                "stage": e.current,
                "stages": list(e.stages),
            }
            for e in list(self.executions.values())
        ]

    def finished(self) -> list[Execution]:
        """Executions that ended since the last call (each returned once)."""
        done = [e for e in self.executions.values() if e.done()]
        for execution in done:
            del self.executions[execution.instance]
        return done

    def wait(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        for execution in list(self.executions.values()):
            execution.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))


def _waiting(entry: PlanEntry) -> Decision:
    """A slot still ahead: `scheduled`, or held by the budget limit or the window that moved it
    (`cooldown`, `min-interval`, ...), so that a person's request says what holds it."""
    if entry.held_by is None:
        return Decision.block("plan", "scheduled", entry.reason, entry.slot_at, slot_at=entry.slot_at)
    stage = "window" if entry.held_by == "window" else "budget"
    return Decision.block(stage, entry.held_by, entry.reason, entry.slot_at, slot_at=entry.slot_at)
