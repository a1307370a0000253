"""The ladder's actions that need no fleet slot: purge the allocator, escalate to a person.

An escalation belongs to the instance (not to one finding), so a crash loop that yields a new finding
per process pages once. While escalated, the instance gets no automatic action (the runtime also stops
the supervisor's relaunches); the escalation ends when a person clears it, when `escalation_expiry`
has passed since it was raised, when a crash-looping instance has stayed up `reset_after`, or, for the
other escalations, when no finding is reported any more. Clearing and expiry both start the crash-loop
count and the restart history afresh.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container
from typing import Any

from agent.core.ports import EventSink
from remediation.deadlines import Clocks, anchored, settle
from remediation.hooks import EngineHooks
from remediation.ledger import Ledger
from remediation.ledger_rows import EscalationRow
from remediation.model import Decision, InstanceView, Intent, RemediationRequest
from remediation.text import at, span

log = logging.getLogger("medic.remediation")
PURGE_TIMEOUT = 30.0


class LadderActions:
    def __init__(
        self,
        ledger: Ledger,
        events: EventSink,
        hooks: EngineHooks,
        *,
        reset_after: float,
        mode: Callable[[], str],
        expiry: float | None = None,
        clock: Callable[[], float] = time.time,
        clocks: Clocks | None = None,
    ) -> None:
        self.expiry = expiry
        self.clock = clock
        self.clocks = clocks or Clocks.for_wall(clock)
        # (instance, escalated at) -> its expiry anchored on the boot clock when first seen in this
        # run: a wall clock moved while the agent runs does not end it (remediation.deadlines)
        self._anchors: dict[tuple[str, float], dict[str, Any]] = {}
        self.ledger = ledger
        self.events = events
        self.hooks = hooks
        self.reset_after = reset_after
        self.mode = mode

    # ----------------------------------------------------------------------------- purge
    def can_purge(self, view: InstanceView) -> bool:
        return self.hooks.purge is not None and (self.hooks.can_purge is None or self.hooks.can_purge(view))

    def purge(self, view: InstanceView, request: RemediationRequest, intent: Intent, now: float) -> Decision:
        mode = self.mode()
        common: dict[str, Any] = {
            "instance": view.name,
            "action": "purge",
            "mode": mode,
            "reason": intent.reason,
            "now": now,
        }
        if mode == "dry-run":
            self.ledger.open_action(
                **common,
                outcome="dry-run",
                request=request,
                started_at=now,
                finished_at=now,
                fleet=view.fleet,
            )
            self.ledger.update_case(
                view.name, request.finding_id, purged_at=now, purge_result="dry-run: not purged"
            )
            self.events.emit(
                "remediation_dry_run",
                f"dry-run: would purge the allocator: {intent.reason}",
                instance=view.name,
            )
            return Decision.allow("act", "dry-run: would purge the allocator now", code="dry-run")
        assert self.hooks.purge is not None  # the ladder only asks for a purge when one is offered
        started = time.monotonic()
        try:
            result = self.hooks.purge(view, PURGE_TIMEOUT)
        except Exception as exc:  # injected: report, never propagate
            result = Decision.block("purge", "error", f"purge failed: {exc.__class__.__name__}: {exc}")
        self.ledger.open_action(
            **common,
            outcome="purged" if result.ok else "failed",
            request=request,
            started_at=now,
            finished_at=now + (time.monotonic() - started),
            detail=result.reason,
            fleet=view.fleet,
            data=dict(result.data),
        )
        self.ledger.update_case(view.name, request.finding_id, purged_at=now, purge_result=result.reason)
        self.events.emit(
            f"remediation_purge_{'done' if result.ok else 'failed'}",
            f"allocator purge: {result.reason}",
            instance=view.name,
            severity="info" if result.ok else "warning",
            **dict(result.data),
        )
        return Decision(
            result.ok, "act", "purged" if result.ok else result.code, result.reason, None, result.data
        )

    # ----------------------------------------------------------------------------- escalation
    def escalate(
        self, view: InstanceView, request: RemediationRequest, intent: Intent, now: float
    ) -> Decision:
        action_id = self.ledger.open_action(
            instance=view.name,
            action="escalate",
            mode=self.mode(),
            reason=intent.reason,
            outcome="escalated",
            now=now,
            request=request,
            started_at=now,
            finished_at=now,
            detail=intent.code,
            fleet=view.fleet,
        )
        self.ledger.escalate(view.name, intent.code, intent.reason, request.finding_id, action_id, now)
        if self.expiry is not None:  # its expiry on the boot clock from the start
            record = {"until": now + self.expiry, "since": now}
            self._anchors[(view.name, now)] = anchored(record, now, self.clocks)
        self.events.emit(
            "remediation_escalated",
            f"needs a person: {intent.reason}",
            instance=view.name,
            severity="critical",
            action_id=action_id,
            code=intent.code,
            finding_id=request.finding_id,
        )
        if self.hooks.on_escalate is not None:
            try:
                self.hooks.on_escalate(view, request, intent)
            except Exception:
                log.exception("the escalation hook failed for %s", view.name)
        return Decision.block("policy", intent.code, f"escalated: {intent.reason}")

    def held(self, view: InstanceView, now: float) -> Intent | None:
        """The hold on an escalated instance, or None (also when it has just expired or a crash loop ended)."""
        escalation = self.ledger.escalation(view.name)
        if escalation is None:
            return None
        if self._expired(escalation, now):
            return None
        crash_loop = escalation["code"] == "crash-loop"
        uptime = view.uptime(now)
        if crash_loop and uptime is not None and uptime >= self.reset_after:
            self._end(view.name, f"up for {span(uptime)} since the crash loop", reset=False, now=now)
            return None
        return Intent("none", "escalated", self.hold_reason(escalation))

    def hold_reason(self, escalation: EscalationRow) -> str:
        """What holds an escalated instance, and what ends the hold: the same words in the plan, the
        decisions and the events."""
        ends = [f"a person clears it (`medic clear {escalation['instance']}`)"]
        if self.expiry is not None:
            ends.append(f"it expires at {at(self.expires_at(escalation))}")
        if escalation["code"] == "crash-loop":
            ends.append(f"it stays up {span(self.reset_after)}")
        return (
            f"escalated at {at(escalation['at'])} ({escalation['reason']}); no automatic restart or relaunch "
            f"until {' or '.join(ends)}"
        )

    def expires_at(self, escalation: EscalationRow) -> float | None:
        if self.expiry is None:
            return None
        anchor = self._anchors.get((escalation["instance"], escalation["at"]))
        return anchor["until"] if anchor else escalation["at"] + self.expiry  # moved with the wall clock

    def _expired(self, escalation: EscalationRow, now: float) -> bool:
        until = self.expires_at(escalation)
        if until is None:
            return False
        key = (escalation["instance"], escalation["at"])
        record = self._anchors.get(key) or {"until": until, "since": escalation["at"]}
        self._anchors[key], _ = settle(record, now, self.clocks)
        if now < self._anchors[key]["until"]:
            return False
        del self._anchors[key]
        assert self.expiry is not None
        self._end(
            escalation["instance"],
            f"the escalation of {at(escalation['at'])} ({escalation['code']}) expired after {span(self.expiry)} "
            "(ladder.escalation_expiry)",
            reset=True,
            now=now,
        )
        return True

    def expire(self, reporting: Container[str], now: float, grace: float) -> None:
        """End escalations past `escalation_expiry`, and those (other than crash loops) of instances
        that no longer report any finding."""
        for escalation in self.ledger.escalations():
            if self._expired(escalation, now):
                continue
            name = escalation["instance"]
            if (
                escalation["code"] != "crash-loop"
                and name not in reporting
                and now - escalation["at"] >= grace
            ):
                self._end(name, "no finding is reported any more", reset=False, now=now)

    def clear(self, instance: str, by: str | None) -> bool:
        """A person looked: the hold ends, and the crash-loop count and restart history start afresh."""
        cleared = self.ledger.clear_escalation(instance, reset_history=True, now=self.clock())
        if cleared:
            self.events.emit(
                "remediation_escalation_cleared",
                f"escalation cleared by {by or 'an operator'}; automatic remediation and relaunches may act again",
                instance=instance,
                by=by,
            )
        return cleared

    def _end(self, instance: str, why: str, *, reset: bool, now: float) -> None:
        self.ledger.clear_escalation(instance, reset_history=reset, now=now)
        self.events.emit(
            "remediation_escalation_expired",
            f"{why}; automatic remediation and relaunches may act again",
            instance=instance,
        )


__all__ = ["PURGE_TIMEOUT", "LadderActions"]
