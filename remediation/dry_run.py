"""Dry-run: what enforce mode would do, recorded without doing it, and never mistaken for done.

A restart that dry-run mode reaches (its slot, the blockers and the budget all allow it) is recorded
once, as an action with outcome `would-restart` about the process it would have restarted. Then:

- that process still runs: its findings keep being judged as they are (still leaking, the same
  projected OOM), and its plan entry shows the would-be restart (`PlanEntry.dry_run`) instead of a
  new slot: no second would-be restart of the same process, no cooldown, and never "cannot be saved"
  because of a restart that did not happen;
- the fleet-wide limits (`max_concurrent`, `min_interval`, `max_per_hour`) count it as they would
  count enforce mode's real restart, so the other instances' slots are where enforce would put
  them; it never counts against the instance's own cooldown (`budget.BudgetState`);
- what enforce would do after that restart (the new process's own finding) is not modelled: the
  entry says so.

A new process of the instance (it was OOM-killed, or restarted by someone else) is judged afresh, and
a person's `medic restart` is always recorded anew. Dry-run never takes a coordinator slot: the
shared budget is untouched.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from remediation.model import Decision, InstanceView, Intent, Plan, PlanEntry, RemediationRequest
from remediation.planner import PlanSettings, latest_start, on_time_until
from remediation.text import at

if TYPE_CHECKING:
    from remediation.ledger import Ledger

# one-shot requests: a person asks again, so each is recorded anew
ASKED_ANEW = ("manual",)


@dataclass(frozen=True, slots=True)
class WouldRestart:
    """The would-be restart dry-run recorded for one process of an instance."""

    action_id: int
    at: float  # when dry-run would have restarted it
    start_time: float  # the process it would have restarted
    reason: str


def answers(would: WouldRestart | None, request: RemediationRequest) -> bool:
    """Whether `would` already answers `request`: a finding about the process it was recorded for."""
    return would is not None and request.kind not in ASKED_ANEW and not request.force


def answered(
    ledger: Ledger,
    wanted: Mapping[str, Intent],
    views: Mapping[str, InstanceView],
    primary: Mapping[str, RemediationRequest],
) -> dict[str, WouldRestart]:
    """The instances that want a restart whose running process dry-run would already have restarted."""
    found = {}
    for name in wanted:
        would = ledger.would_restart(name, views[name].start_time)
        if would is not None and answers(would, primary[name]):
            found[name] = would
    return found


def with_would_be(
    plan: Plan,
    answered: Mapping[str, WouldRestart],
    views: Mapping[str, InstanceView],
    primary: Mapping[str, RemediationRequest],
    wanted: Mapping[str, Intent],
    agent: str,
    settings: PlanSettings,
) -> Plan:
    """`plan` (made without the `answered` instances) with their would-be restarts in it, in slot order."""
    if not answered:
        return plan
    would = [entry(w, views[n], primary[n], wanted[n], agent, settings) for n, w in answered.items()]
    entries = sorted([*plan.entries, *would], key=lambda e: (e.slot_at, e.fleet, e.instance))
    return replace(plan, entries=tuple(entries))


def decision(would: WouldRestart, request: RemediationRequest, view: InstanceView) -> Decision:
    """What dry-run says each step after its would-be restart: the same verdict, with what is true now."""
    still = (
        f"OOM still projected {at(request.deadline)}" if request.deadline is not None else "still reported"
    )
    return Decision.allow(
        "act",
        f"dry-run: would have restarted {view.name} at {at(would.at)} (action {would.action_id}); nothing "
        f"was restarted, so pid {view.pid} runs on: {request.kind} {still} ({request.reason}); what "
        "enforce would do after that restart (the new process's own findings) is not modelled",
        code="dry-run",
        action_id=would.action_id,
        would_restart_at=would.at,
    )


def entry(
    would: WouldRestart,
    view: InstanceView,
    request: RemediationRequest,
    intent: Intent,
    agent: str,
    settings: PlanSettings,
) -> PlanEntry:
    """The plan's row for an instance whose process dry-run would already have restarted: at the time
    it would have, against the deadline its finding projects now."""
    deadline = intent.deadline
    latest = latest_start(deadline, settings) if deadline is not None else None
    late = deadline is not None and would.at > on_time_until(deadline, settings)
    against = f"OOM projected {at(deadline)}" if deadline is not None else f"{request.kind}: {request.reason}"
    return PlanEntry(
        instance=view.name,
        fleet=view.fleet,
        agent=agent,
        slot_at=would.at,
        latest_start=latest,
        deadline=deadline,
        kind=request.kind,
        finding_id=request.finding_id,
        late=late,
        hopeless=False,
        reason=(
            f"would restart at {at(would.at)} (dry-run, action {would.action_id}): nothing was restarted, "
            f"so the process still runs ({against}); the restart enforce would plan after it depends on "
            "the new process's own findings, which dry-run cannot see"
        ),
        dry_run=True,
    )
