"""Requests in: validated, stale ones set aside, grouped per instance, each one's case kept in the ledger.

Findings arrive every step while they hold (level-triggered); a finding not seen for `grace` is
closed as cleared. One-shot requests (`submit`: the API's restart) are kept until carried out or
`SUBMITTED_TTL` passes; each has its action in the ledger from the moment it is asked, which says
after every step whether it is held and why (`note`), and how it ended. A request about a process
that is no longer the instance's (`start_time` differs) is stale: the new, healthy process is
never restarted for it.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from agent.core.errors import StoreError
from agent.core.ports import EventSink
from probes.linux.procfs import same_process
from remediation import policy
from remediation.ledger import WAITING, Ledger
from remediation.model import Decision, InstanceView, RemediationRequest
from remediation.text import at

log = logging.getLogger("medic.remediation")
DB_ERRORS = (sqlite3.Error, StoreError)
SUBMITTED_TTL = 3600.0  # a manual or external request not carried out within this is dropped
CARRIED_OUT = ("started", "dry-run")  # decisions that write the request's action themselves


@dataclass(slots=True)
class Submitted:
    """A one-shot request kept until it is carried out, with its action and what was last said of it."""

    request: RemediationRequest
    since: float
    action_id: int | None  # None: the ledger could not be written when it was asked
    said: tuple[str, str] = ("requested", "")

    def to_dict(self) -> dict[str, object]:
        """As `medic plan` and the dashboard show a request still waiting."""
        return {
            "instance": self.request.instance,
            "kind": self.request.kind,
            "reason": self.request.reason,
            "requested_by": self.request.requested_by,
            "requested_at": self.since,
            "action_id": self.action_id,
            "status": self.said[0],
            "detail": self.said[1],
        }


class Intake:
    def __init__(
        self,
        ledger: Ledger,
        events: EventSink,
        *,
        clear_check: float,
        grace: float,
        clock: Callable[[], float],
    ) -> None:
        self.ledger = ledger
        self.events = events
        self.clear_check = clear_check
        self.grace = grace
        self.clock = clock
        self._lock = threading.Lock()  # submit() from the API never waits for a step
        self._submitted: dict[str, Submitted] = {}
        self._rejected: set[tuple[str, str]] = set()

    # ----------------------------------------------------------------------------- one-shot requests
    def submit(self, request: RemediationRequest, mode: str) -> Decision:
        """Keep `request` for the next steps and open its action (`requested`); `data.action_id` names it."""
        problem = request.problem()
        if problem:
            return Decision.block("check", "bad-request", problem)
        now = self.clock()
        action_id = self._open(request, mode, now)
        with self._lock:
            previous = self._submitted.get(request.instance)
            self._submitted[request.instance] = Submitted(request, now, action_id)
        if previous is not None:
            self._update(
                previous,
                outcome="replaced",
                finished_at=now,
                detail=f"replaced by a newer request (action {action_id})",
            )
        forced = " (forced)" if request.force else ""
        self.events.emit(
            "remediation_requested",
            f"{request.kind} restart requested{forced}: {request.reason}",
            instance=request.instance,
            severity="warning" if request.force else "info",
            by=request.requested_by,
            finding_id=request.finding_id,
            force=request.force,
            action_id=action_id,
        )
        return Decision.allow("check", "request accepted", action_id=action_id)

    def _open(self, request: RemediationRequest, mode: str, now: float) -> int | None:
        """The request's action, `requested`; None when the ledger cannot be written (a full disk):
        the request is kept in memory all the same, and its restart opens its own action."""
        try:
            return self.ledger.open_action(
                instance=request.instance,
                action="restart",
                mode=mode,
                reason=f"{request.kind} request by {request.requested_by or 'an operator'}: {request.reason}",
                outcome="requested",
                now=now,
                request=request,
                detail="waiting for the next remediation step",
            )
        except DB_ERRORS as exc:
            log.error("the restart request for %s is kept in memory only: %s", request.instance, exc)
            return None

    def _update(self, submitted: Submitted, only_while: tuple[str, ...] = (), **fields: object) -> None:
        if submitted.action_id is not None:
            self.ledger.update_action(submitted.action_id, only_while=only_while, **fields)

    def action_id(self, request: RemediationRequest) -> int | None:
        """The action of a one-shot request still kept (None for a finding's request)."""
        with self._lock:
            submitted = self._submitted.get(request.instance)
        return submitted.action_id if submitted is not None and submitted.request is request else None

    def pending(self) -> list[Submitted]:
        with self._lock:
            return list(self._submitted.values())

    def note(self, decisions: Mapping[str, Decision], considered: Sequence[RemediationRequest]) -> None:
        """Say in each kept request's action what this step decided for its instance: `held` with
        the reason (and when it is tried again) while it waits, written when that changes. Only the
        requests the step `considered` (`take`): one submitted while it ran (a forced restart
        replacing a held one) was not decided by it, and must not get the old one's answer."""
        for submitted in self.pending():
            decision = decisions.get(submitted.request.instance)
            if decision is None or decision.code in CARRIED_OUT:
                continue
            if not any(submitted.request is request for request in considered):
                continue
            outcome = "requested" if decision.ok else "held"
            detail = f"{outcome}: {decision.stage}/{decision.code}: {decision.reason}"
            if decision.retry_at is not None:
                detail += f" (tried again {at(decision.retry_at)})"
            if (outcome, detail) != submitted.said:
                submitted.said = (outcome, detail)
                self._update(
                    submitted,
                    only_while=WAITING,
                    outcome=outcome,
                    detail=detail,
                    data={"decision": decision.to_dict()},
                )

    def done(self, instance: str, finding_id: str | None = None) -> None:
        """The one-shot request of `instance` was carried out (or recorded, in dry-run)."""
        with self._lock:
            submitted = self._submitted.get(instance)
            if submitted is not None and finding_id in (None, submitted.request.finding_id):
                del self._submitted[instance]

    # ----------------------------------------------------------------------------- each step
    def take(
        self, now: float, requests: Iterable[RemediationRequest], views: Mapping[str, InstanceView]
    ) -> tuple[dict[str, RemediationRequest], dict[str, Decision], list[RemediationRequest]]:
        """(the leading request per instance, decisions for instances whose only requests were stale,
        the kept one-shot requests this step considers: what `note` may answer)."""
        with self._lock:
            expired = [s for s in self._submitted.values() if now - s.since > SUBMITTED_TTL]
            for gone in expired:
                del self._submitted[gone.request.instance]
            submitted = [s.request for s in self._submitted.values()]
        for gone in expired:
            self._expire(gone, now)
        grouped: dict[str, list[RemediationRequest]] = defaultdict(list)
        stale: dict[str, Decision] = {}
        for request in [*requests, *submitted]:
            problem = request.problem()
            if problem is None and request.instance not in views:
                problem = f"no instance named {request.instance!r} is watched by this agent"
            if problem is not None:
                self._reject(request, problem)
                continue
            view = views[request.instance]
            if (
                request.start_time is not None
                and view.start_time is not None
                and not same_process(request.start_time, view.start_time)
            ):
                stale[request.instance] = Decision.block(
                    "check",
                    "stale",
                    f"finding {request.finding_id} is about the process started {at(request.start_time)}; "
                    f"{view.name} now runs pid {view.pid} (started {at(view.start_time)}); waiting for a fresh "
                    "finding",
                )
                continue
            grouped[request.instance].append(request)
        self._keep_cases(grouped, now)
        primary = {name: policy.primary_request(reqs) for name, reqs in grouped.items()}
        return primary, {name: d for name, d in stale.items() if name not in primary}, submitted

    def _expire(self, gone: Submitted, now: float) -> None:
        last = gone.said[1] or "no step decided it"
        why = f"not carried out within {SUBMITTED_TTL / 60:g} min of the request; last {last}"
        self._update(gone, outcome="abandoned", finished_at=now, detail=why)
        self.events.emit(
            "remediation_request_rejected",
            f"{gone.request.kind} restart request dropped: {why}",
            instance=gone.request.instance,
            severity="warning",
            action_id=gone.action_id,
        )

    def _reject(self, request: RemediationRequest, problem: str) -> None:
        key = (str(request.instance), str(request.finding_id))
        if key not in self._rejected:  # once per request, not every step
            self._rejected.add(key)
            self.events.emit(
                "remediation_request_rejected",
                problem,
                instance=str(request.instance) or None,
                severity="warning",
            )

    def _keep_cases(self, grouped: Mapping[str, list[RemediationRequest]], now: float) -> None:
        seen = set()
        for reqs in grouped.values():
            for request in reqs:
                self.ledger.touch_case(request, now, self.clear_check)
                seen.add((request.instance, request.finding_id))
        for case in self.ledger.close_missing_cases(seen, now, self.grace):
            if case.restarted_at or case.purged_at or case.escalated_at:
                self.events.emit(
                    "remediation_finding_cleared",
                    f"{case.kind} finding {case.finding_id} cleared",
                    instance=case.instance,
                    finding_id=case.finding_id,
                )
