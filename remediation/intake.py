"""Requests in: validated, stale ones set aside, grouped per instance, each one's case kept in the ledger.

Findings arrive every step while they hold (level-triggered); a finding not seen for `grace` is
closed as cleared. One-shot requests (`submit`: the API's restart, Alertmanager) are kept until
carried out or `SUBMITTED_TTL` passes. A request about a process that is no longer the instance's
(`start_time` differs) is stale: the new, healthy process is never restarted for it.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping

from agent.core.ports import EventSink
from probes.linux.procfs import same_process
from remediation import policy
from remediation.ledger import Ledger
from remediation.model import Decision, InstanceView, RemediationRequest
from remediation.text import at

SUBMITTED_TTL = 3600.0  # a manual or external request not carried out within this is dropped


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
        self._submitted: dict[str, tuple[RemediationRequest, float]] = {}
        self._rejected: set[tuple[str, str]] = set()

    # ----------------------------------------------------------------------------- one-shot requests
    def submit(self, request: RemediationRequest) -> Decision:
        problem = request.problem()
        if problem:
            return Decision.block("check", "bad-request", problem)
        with self._lock:
            self._submitted[request.instance] = (request, self.clock())
        forced = " (forced)" if request.force else ""
        self.events.emit(
            "remediation_requested",
            f"{request.kind} restart requested{forced}: {request.reason}",
            instance=request.instance,
            severity="warning" if request.force else "info",
            by=request.requested_by,
            finding_id=request.finding_id,
            force=request.force,
        )
        return Decision.allow("check", "request accepted")

    def done(self, instance: str, finding_id: str | None = None) -> None:
        """The one-shot request of `instance` was carried out (or recorded, in dry-run)."""
        with self._lock:
            submitted = self._submitted.get(instance)
            if submitted is not None and finding_id in (None, submitted[0].finding_id):
                del self._submitted[instance]

    # ----------------------------------------------------------------------------- each step
    def take(
        self, now: float, requests: Iterable[RemediationRequest], views: Mapping[str, InstanceView]
    ) -> tuple[dict[str, RemediationRequest], dict[str, Decision]]:
        """(the leading request per instance, decisions for instances whose only requests were stale)."""
        with self._lock:
            for name, (_, since) in list(self._submitted.items()):
                if now - since > SUBMITTED_TTL:
                    del self._submitted[name]
            submitted = [r for r, _ in self._submitted.values()]
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
        return primary, {name: d for name, d in stale.items() if name not in primary}

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
