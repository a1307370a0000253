"""The ladder: from a request and what happened to its case so far, what to do now, and why.

    fragmentation  → purge the allocator (if the instance offers it) → wait `purge_settle`
                     → restart only if the finding is still there
    leak, oom-risk → only a critical finding (growth shown not to level off, OOM within reach): the
                     others are watched, no restart planned, the reason shown in the plan;
                     restart, planned before the deadline; found again on the process a restart
                     started: planned again by its new deadline (a restart buys time, it does not
                     fix the code), unless the restart bought no time (below)
    slow           → restart once the finding has held for `slow_confirm`
    manual, external → restart as soon as the budget allows
    any            → escalate (no more restarts; a person must look) when a restart failed or did
                     not clear the finding within `clear_check`, or when the instance was restarted
                     `crash_loop.max_restarts` times in `crash_loop.window` (the count resets once it
                     has stayed up `crash_loop.reset_after`); a returning leak instead escalates
                     when its new latest safe start is not after the OOM projected when it was
                     restarted: the next restart would be due before the old process would have died

Pure functions of their arguments; the engine keeps the cases in the ledger.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from remediation.model import KIND_PRIORITY, Intent, Lifetime, RemediationRequest
from remediation.planner import PlanSettings, latest_start
from remediation.text import at, span

OOM_KINDS = ("leak", "oom-risk")  # one restart answers both: they share the restart's history


@dataclass(frozen=True, slots=True)
class LadderSettings:
    purge_settle: float = 120.0
    slow_confirm: float = 120.0
    clear_check: float = 600.0
    crash_loop_restarts: int = 3
    crash_loop_window: float = 3600.0
    crash_loop_reset_after: float = 1800.0


@dataclass(frozen=True, slots=True)
class CaseHistory:
    """What happened so far to one (instance, finding) case."""

    instance: str
    finding_id: str
    kind: str
    first_seen: float
    last_seen: float
    purged_at: float | None = None
    purge_result: str | None = None
    restarted_at: float | None = None  # when the last restart for this case ended
    restart_outcome: str | None = None  # succeeded | failed | timed-out | ...
    escalated_at: float | None = None
    restart_deadline: float | None = None  # the projected OOM that restart was made against
    restart_finding: str | None = None  # the finding it was made for: another one means inherited

    @property
    def after_restart(self) -> bool:
        """This finding was first seen on a process that a restart (for an earlier finding) started."""
        return self.restart_finding is not None and self.restart_finding != self.finding_id


def related_kinds(kind: str) -> tuple[str, ...]:
    """The kinds whose restart a new finding of `kind` inherits (a leak restart also answers an OOM
    risk); none for a person's request: a new ask, never "the last restart did not help"."""
    if kind == "manual":
        return ()
    return OOM_KINDS if kind in OOM_KINDS else (kind,)


def crash_loop_count(starts: Sequence[float], now: float, window: float, reset_after: float) -> int:
    """Restarts in the current run of short-lived processes, within `window` before `now`.

    `starts` are the start times of the instance's successive processes. A process that lived
    `reset_after` or longer ends a run; so does the current one once it has been up that long.
    """
    ordered = sorted(s for s in starts if s <= now)
    if len(ordered) < 2 or now - ordered[-1] >= reset_after:
        return 0
    count = 0
    for i in range(len(ordered) - 1, 0, -1):
        current, previous = ordered[i], ordered[i - 1]
        if current <= now - window:
            break
        count += 1
        if current - previous >= reset_after:
            break
    return count


def crash_loop_run(
    lifetimes: Sequence[Lifetime], now: float, window: float, reset_after: float
) -> list[Lifetime]:
    """The processes of the current crash loop: those that ended having lived less than
    `reset_after`, started within `window` before `now`, newest last, back to the last process that
    stayed up `reset_after` (which ends a run, as does the current one once it has been up that long).

    Judged from real uptimes, so a relaunch back-off longer than `reset_after` does not hide a loop.
    """
    ordered = sorted((lt for lt in lifetimes if lt.start <= now), key=lambda lt: lt.start)
    run: list[Lifetime] = []
    for lifetime in reversed(ordered):
        if lifetime.uptime(now) >= reset_after:
            break
        if lifetime.start < now - window:
            break
        if lifetime.end is not None:
            run.append(lifetime)
    return run[::-1]


def primary_request(requests: Sequence[RemediationRequest]) -> RemediationRequest:
    """The request that leads an instance's case: forced first, then a crash loop, then a person's
    (they asked for now: held behind a finding's later slot, their request would wait unseen),
    then one a restart may be planned for (a watched leak or OOM risk leading would hold a critical
    one behind it), then the earliest deadline, then kind."""
    return min(
        requests,
        key=lambda r: (
            not r.force,
            r.kind != "crash-loop",
            r.kind != "manual",
            _watched(r),
            r.deadline if r.deadline is not None else float("inf"),
            KIND_PRIORITY.get(r.kind, 99),
            r.finding_id,
        ),
    )


def decide(
    request: RemediationRequest,
    case: CaseHistory,
    starts: Sequence[float],
    settings: LadderSettings,
    now: float,
    *,
    can_purge: bool,
    plan: PlanSettings | None = None,
) -> Intent:
    """What the ladder wants for this request now (`plan` gives a returning leak's latest safe start)."""
    if request.force:
        who = request.requested_by or "an operator"
        return Intent("restart", "forced", f"restart forced by {who}: {request.reason}")
    if case.escalated_at is not None:
        return Intent(
            "none",
            "escalated",
            f"escalated at {at(case.escalated_at)}; no automatic restart until a person clears it",
        )
    if request.kind == "crash-loop":
        return Intent(
            "escalate",
            "crash-loop",
            f"{request.reason}: a person must look; in enforce mode medic neither restarts nor relaunches "
            "it (the supervisor included) until the escalation is cleared or expires",
        )
    restarts = crash_loop_count(starts, now, settings.crash_loop_window, settings.crash_loop_reset_after)
    if restarts >= settings.crash_loop_restarts:
        return Intent(
            "escalate",
            "crash-loop",
            f"{request.instance} was restarted {restarts} times within {span(settings.crash_loop_window)} "
            f"without staying up {span(settings.crash_loop_reset_after)}: crash loop; medic stops "
            "restarting it, a person must look",
        )
    if request.kind in OOM_KINDS and (case.restarted_at is None or case.after_restart):
        watched = _not_critical(request)
        if watched is not None:
            return watched
    if case.restarted_at is not None:
        if case.restart_outcome not in (None, "succeeded"):
            return Intent(
                "escalate",
                "restart-failed",
                f"the restart at {at(case.restarted_at)} ended {case.restart_outcome}; medic will not "
                "try again on its own",
            )
        if request.kind in OOM_KINDS and request.deadline is not None and case.after_restart:
            return _leak_returned(request, case, plan or PlanSettings())
        settle_until = case.restarted_at + settings.clear_check
        if now < settle_until:
            return Intent(
                "wait",
                "checking-restart",
                f"restarted at {at(case.restarted_at)}; checking that {request.kind} finding "
                f"{request.finding_id} clears by {at(settle_until)}",
            )
        return Intent(
            "escalate",
            "restart-did-not-help",
            f"the restart at {at(case.restarted_at)} did not clear {request.kind} finding "
            f"{request.finding_id} (still reported {span(now - case.restarted_at)} later)",
        )
    kind = request.kind
    if kind == "fragmentation":
        return _fragmentation(request, case, settings, now, can_purge)
    if kind in ("leak", "oom-risk"):
        if request.deadline is None:
            return Intent(
                "restart", kind, f"{kind}: {request.reason}; no deadline given, restart when allowed"
            )
        return Intent("restart", kind, f"{kind}: {request.reason}", deadline=request.deadline)
    if kind == "slow":
        confirmed_at = case.first_seen + settings.slow_confirm
        if now < confirmed_at:
            return Intent(
                "wait",
                "confirming",
                f"slow since {at(case.first_seen)}; restart if still slow at {at(confirmed_at)}",
            )
        return Intent("restart", "slow", f"slow for {span(now - case.first_seen)}: {request.reason}")
    return Intent("restart", kind, f"{kind} request: {request.reason}")


def _watched(request: RemediationRequest) -> bool:
    """A leak or OOM risk that the detectors did not make critical: watched, not restarted. A
    request that carries no finding (a person's) is not judged by severity, nor a finding whose
    peaks are already at or past the limit: nothing there is a projection that may level off."""
    finding = request.finding or {}
    severity = finding.get("severity")
    evidence = finding.get("evidence")
    if isinstance(evidence, dict) and evidence.get("above_limit"):
        return False
    return request.kind in OOM_KINDS and severity is not None and severity != "critical"


def _not_critical(request: RemediationRequest) -> Intent | None:
    """A leak or OOM risk that the detectors did not make critical is watched, not restarted: only a
    critical one stands on evidence that the growth does not level off (a cache filling to its TTL,
    fragmentation like log(t)) and reaches the limit soon; the finding's `not_critical` says why."""
    if not _watched(request):
        return None
    severity = request.finding.get("severity")
    evidence = request.finding.get("evidence")
    why = evidence.get("not_critical") if isinstance(evidence, dict) else None
    return Intent(
        "wait",
        "watched",
        f"{request.kind} ({severity}) watched, no restart planned: not yet critical: "
        f"{why or 'the growth may still level off below the limit, or the limit is not within a quarter of the horizon'}",
    )


def _leak_returned(request: RemediationRequest, case: CaseHistory, plan: PlanSettings) -> Intent:
    """A leak found again on the new process: expected, so planned again by its deadline, unless the
    restart bought no time (memory back at the old level at once: another restart cannot help)."""
    assert request.deadline is not None and case.restarted_at is not None
    latest = latest_start(request.deadline, plan)
    before = case.restart_deadline
    if before is not None and latest <= before:
        return Intent(
            "escalate",
            "restart-did-not-help",
            f"the restart at {at(case.restarted_at)} bought no time: {request.kind} finding "
            f"{request.finding_id} on the new process projects the OOM at {at(request.deadline)} (it was "
            f"{at(before)} before the restart), so another restart would be due by {at(latest)}, before the "
            "old process would have run out; a person must look",
        )
    gained = "" if before is None else f", {span(request.deadline - before)} later than before it"
    return Intent(
        "restart",
        "leak-returned",
        f"{request.kind} again after the restart at {at(case.restarted_at)} (a restart buys time, it does "
        f"not fix the leak; OOM now projected {at(request.deadline)}{gained}): {request.reason}",
        deadline=request.deadline,
    )


def _fragmentation(
    request: RemediationRequest, case: CaseHistory, settings: LadderSettings, now: float, can_purge: bool
) -> Intent:
    if case.purged_at is None:
        if can_purge:
            return Intent(
                "purge", "purge-first", f"fragmentation: {request.reason}; purging the allocator first"
            )
        return Intent(
            "restart",
            "no-purge",
            f"fragmentation: {request.reason}; this instance offers no allocator purge (no hook), so restart",
        )
    settled_at = case.purged_at + settings.purge_settle
    if now < settled_at:
        return Intent(
            "wait",
            "purge-settling",
            f"purged at {at(case.purged_at)} ({case.purge_result or 'no result'}); checking at "
            f"{at(settled_at)} whether it helped",
        )
    return Intent(
        "restart",
        "purge-did-not-help",
        f"the purge at {at(case.purged_at)} ({case.purge_result or 'no result'}) did not clear the "
        f"fragmentation: {request.reason}",
    )
