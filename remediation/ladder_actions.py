"""The ladder's actions that need no fleet slot: purge the allocator, escalate to a person.

An escalation belongs to the instance (not to one finding), so a crash loop that yields a new finding
per process pages once. While escalated, the instance gets no automatic action; the escalation ends
when a person clears it, when a crash-looping instance has stayed up `reset_after`, or, for the other
escalations, when no finding is reported any more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Container
from typing import Any

from agent.core.ports import EventSink
from remediation.hooks import EngineHooks
from remediation.ledger import Ledger
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
    ) -> None:
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
        """The hold on an escalated instance, or None (also when a crash loop has just ended)."""
        escalation = self.ledger.escalation(view.name)
        if escalation is None:
            return None
        crash_loop = escalation["code"] == "crash-loop"
        uptime = view.uptime(now)
        if crash_loop and uptime is not None and uptime >= self.reset_after:
            self._end(view.name, f"up for {span(uptime)} since the crash loop")
            return None
        until = f" or it stays up {span(self.reset_after)}" if crash_loop else ""
        return Intent(
            "none",
            "escalated",
            f"escalated at {at(escalation['at'])} ({escalation['reason']}); no automatic action until a person "
            f"clears it{until}",
        )

    def expire(self, reporting: Container[str], now: float, grace: float) -> None:
        """End escalations (other than crash loops) of instances that no longer report any finding."""
        for escalation in self.ledger.escalations():
            name = escalation["instance"]
            if (
                escalation["code"] != "crash-loop"
                and name not in reporting
                and now - escalation["at"] >= grace
            ):
                self._end(name, "no finding is reported any more")

    def clear(self, instance: str, by: str | None) -> bool:
        cleared = self.ledger.clear_escalation(instance, reset_history=True)
        self.events.emit(
            "remediation_escalation_cleared",
            f"escalation cleared by {by or 'an operator'}; automatic remediation may act again",
            instance=instance,
        )
        return cleared

    def _end(self, instance: str, why: str) -> None:
        self.ledger.clear_escalation(instance, reset_history=False)
        self.events.emit(
            "remediation_escalation_expired", f"{why}; automatic remediation may act again", instance=instance
        )


__all__ = ["PURGE_TIMEOUT", "LadderActions"]
