"""One restart, carried out in its own thread while its coordinator slot is held and kept alive:

    evidence → drain → act → verify (process up, health, warm-up) → release

Each stage's Decision is kept in the action's `stages`; the first that fails ends the restart.
The slot is renewed every TTL/3 and always released at the end with the outcome:
    succeeded  restarted and verified
    failed     the actuator or the verification failed (the ladder escalates)
    skipped    nothing was restarted (drain failed, the process was no longer the instance)
    interrupted  the agent stopped meanwhile
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.core.ports import EventSink
from remediation.actuators.base import Actuator
from remediation.coordinator.base import Coordinator, Grant
from remediation.drain import Drain
from remediation.errors import CoordinatorError
from remediation.evidence import CaptureFn, EvidenceStore
from remediation.ledger import Ledger
from remediation.model import Decision, InstanceView, RemediationRequest
from remediation.verify import Verifier

log = logging.getLogger("medic.remediation")
_NOTHING_DONE = {"no-process", "gone", "pid-reused", "cmdline-mismatch"}


@dataclass
class RestartJob:
    action_id: int
    view: InstanceView
    request: RemediationRequest | None
    grant: Grant | None  # None only for restarts that bypass the coordinator (never in practice)
    actuator: Actuator
    verifier: Verifier
    drain: Drain | None = None
    evidence: EvidenceStore | None = None
    captures: Mapping[str, CaptureFn] = field(default_factory=dict)
    act_timeout: float = 300.0


class Execution:
    def __init__(
        self,
        job: RestartJob,
        *,
        coordinator: Coordinator,
        ledger: Ledger,
        events: EventSink,
        stop: threading.Event,
        clock: Callable[[], float] = time.time,
        paused: Callable[[float], object] = lambda now: None,
    ) -> None:
        self.job = job
        self.paused = paused  # checked again just before acting: a pause that lands mid-step still holds
        self.coordinator = coordinator
        self.ledger = ledger
        self.events = events
        self.stop = stop
        self.clock = clock
        self.outcome: str | None = None
        self.finished_at: float | None = None
        self.stages: list[dict[str, Any]] = []
        self.current = "starting"  # the stage running now, for the plan
        self.started_at = clock()
        self.lease_lost: str | None = None
        self._done = threading.Event()  # set last, once the ledger and the coordinator know the outcome
        self._stages_over = threading.Event()  # stops the keep-alive
        self._thread = threading.Thread(target=self._run, name=f"restart-{job.view.name}", daemon=True)

    @property
    def instance(self) -> str:
        return self.job.view.name

    def start(self) -> None:
        self._thread.start()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    # ----------------------------------------------------------------------------- the stages
    def _run(self) -> None:
        job = self.job
        keepalive = threading.Thread(target=self._keep_alive, name=f"lease-{job.view.name}", daemon=True)
        keepalive.start()
        outcome, detail, new_pid = "failed", "", None
        try:
            outcome, detail, new_pid = self._stages()
        except Exception as exc:  # a bug here must still release the slot and close the action
            log.exception("restart of %s failed unexpectedly", job.view.name)
            outcome, detail = "failed", f"internal error: {exc.__class__.__name__}: {exc}"
        finally:
            self.finished_at = self.clock()
            self.outcome = outcome
            self._stages_over.set()
            keepalive.join(timeout=5)
            self._release(outcome)
            self.ledger.update_action(
                job.action_id,
                outcome=outcome,
                detail=detail,
                finished_at=self.finished_at,
                new_pid=new_pid,
                stages=self.stages,
                data={"lease_lost": self.lease_lost} if self.lease_lost else {},
            )
            self.events.emit(
                f"remediation_restart_{outcome}",
                f"restart {outcome}: {detail}",
                instance=job.view.name,
                severity="info"
                if outcome == "succeeded"
                else ("warning" if outcome == "skipped" else "error"),
                action_id=job.action_id,
                finding_id=job.request.finding_id if job.request else None,
                new_pid=new_pid,
            )
            self._done.set()

    def _held_by_pause(self) -> bool:
        """A pause in force now stops a restart that has not acted yet (forced ones too: the kill switch wins)."""
        return self.paused(self.clock()) is not None

    def _stage(self, decision: Decision, started: float) -> Decision:
        self.stages.append({**decision.to_dict(), "seconds": round(time.monotonic() - started, 3)})
        return decision

    def _stages(self) -> tuple[str, str, int | None]:
        job = self.job
        if job.evidence is not None and (job.captures or job.request):
            self.current = "evidence"
            started = time.monotonic()
            finding = job.request.finding_record() if job.request else None
            items = job.evidence.capture(job.action_id, job.view, job.captures, finding)
            self.ledger.update_action(job.action_id, evidence=[i.to_dict() for i in items])
            for pruned in job.evidence.take_pruned():  # older actions' evidence, removed to keep `keep`
                self.ledger.update_action(pruned, evidence=[])
            failed = [i.name for i in items if i.error]
            self._stage(
                Decision.allow(
                    "evidence",
                    f"captured {sum(1 for i in items if not i.error)} item(s)"
                    + (f"; failed: {', '.join(failed)}" if failed else ""),
                ),
                started,
            )
        if self.stop.is_set():
            return "interrupted", "the agent stopped before the restart", None
        if self._held_by_pause():
            return "skipped", "remediation was paused before the restart began: nothing was done", None
        if job.drain is not None:
            self.current = "drain"
            started = time.monotonic()
            drained = self._stage(job.drain.run(job.view, job.request, self.stop), started)
            if not drained.ok:
                return "skipped", drained.reason, None
        if self._held_by_pause():
            return "skipped", "remediation was paused during the drain: the process was not restarted", None
        self.current = "act"
        started = time.monotonic()
        acted = self._stage(job.actuator.restart(job.view, job.request, job.act_timeout), started)
        if not acted.ok:
            return ("skipped" if acted.code in _NOTHING_DONE else "failed"), acted.reason, None
        self.current = "verify"
        started = time.monotonic()
        verified = self._stage(job.verifier.verify(job.view, job.request, self.stop), started)
        new_pid = verified.data.get("new_pid") or acted.data.get("new_pid")
        self._warmup_stage(verified)
        if self.stop.is_set() and not verified.ok:
            return "interrupted", f"{acted.reason}; the agent stopped before verification", new_pid
        if not verified.ok:
            return "failed", f"{acted.reason}; verification failed: {verified.reason}", new_pid
        return "succeeded", f"{acted.reason}; {verified.reason}", new_pid

    def _warmup_stage(self, verified: Decision) -> None:
        """The warm-up gate's outcome as a stage of its own; a cold instance is an event."""
        warmup = verified.data.get("warmup")
        if not isinstance(warmup, dict):
            return
        self.stages.append(dict(warmup))
        if not warmup.get("ok"):
            released = verified.ok
            self.events.emit(
                "remediation_warmup_timeout",
                f"not warm in time: {warmup.get('reason')}; "
                + (
                    "the slot was released all the same (verify.warmup.on_cold: release)"
                    if released
                    else "the restart counts as failed and is escalated (verify.warmup.on_cold: escalate)"
                ),
                instance=self.instance,
                severity="warning" if released else "error",
                action_id=self.job.action_id,
            )

    # ----------------------------------------------------------------------------- the slot
    def _keep_alive(self) -> None:
        grant = self.job.grant
        if grant is None:
            return
        interval = max(0.5, grant.ttl / 3)
        while not self._stages_over.wait(interval):
            try:
                self.coordinator.renew(grant)
            except CoordinatorError as exc:
                if self.lease_lost is None:
                    self.lease_lost = str(exc)
                    self.events.emit(
                        "remediation_lease_lost",
                        f"cannot renew the restart slot: {exc}; another agent may start a restart meanwhile",
                        instance=self.instance,
                        severity="error",
                        action_id=self.job.action_id,
                    )

    def _release(self, outcome: str) -> None:
        if self.job.grant is None:
            return
        try:
            self.coordinator.release(self.job.grant, outcome)
        except CoordinatorError as exc:
            self.events.emit(
                "remediation_release_failed",
                f"cannot release the restart slot ({exc}); it frees itself when its lease expires",
                instance=self.instance,
                severity="warning",
                action_id=self.job.action_id,
            )
