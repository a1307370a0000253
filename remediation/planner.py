"""The planner: one pure function from (what the fleet wants, restarts so far, budget, time) to a schedule.

For each fleet:
1. Every instance with a deadline gets a latest safe start: the deadline rounded down to
   `deadline_granularity` (so that a wobbling estimate does not move its slot), minus the safety
   margin, minus the time a restart takes.
2. Backward pass, latest deadline first: each slot is as late as its own latest start allows and
   one budget gap before the next slot. A fleet that leaks in lockstep is thus spread out early
   enough that all of it fits: "start a day early and roll slowly".
3. Forward pass, earliest slot first, through the real budget (`budget.admit`, walked by
   `earliest_start`) and the time windows: a slot the past, the restart history, a cooldown or a
   window pushes later is moved; if it then misses its latest start the entry is `late` and the plan
   says so (restarts still go in deadline order, as early as allowed). Late means the deadline
   itself cannot be met: judged against the exact deadline (not the rounded one), and a start up to
   one engine `step` after it is on time (the step that first reaches a slot comes up to one step
   after it). An entry whose earliest slot would end after its projected OOM itself is `hopeless`:
   its slot is left to instances that can still be saved (deadline order under overload otherwise
   spends every slot on instances that die anyway, and the next ones too).
4. Requests without a deadline (slow, manual, external) take the earliest slots that do not push a
   deadline-driven slot; their order among themselves is by request time, then by a hash of the
   name: deterministic, so every agent derives the same plan from the same shared view.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict, deque
from collections.abc import Iterable
from dataclasses import dataclass

from remediation.budget import FLEET_WIDE, BudgetLimits, BudgetState, admit
from remediation.model import FleetEntry, Plan, PlanEntry, RestartRecord
from remediation.text import at, span
from remediation.windows import Windows


@dataclass(frozen=True, slots=True)
class PlanSettings:
    safety_margin: float = 3600.0  # finish this long before the projected OOM
    restart_duration: float = 300.0  # how long a restart holds a slot (restart + verify + warm-up)
    deadline_granularity: float = 300.0  # deadlines are rounded down to this (stable slots)
    step: float = 0.0  # the engine's step: a start up to this long after the latest safe start is on time


def stable_hash(name: str) -> int:
    """A per-instance number that is the same in every process (unlike `hash()`)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


def latest_start(deadline: float, settings: PlanSettings) -> float:
    granularity = settings.deadline_granularity
    rounded = math.floor(deadline / granularity) * granularity if granularity > 0 else deadline
    return rounded - settings.safety_margin - settings.restart_duration


def on_time_until(deadline: float, settings: PlanSettings) -> float:
    """The last start that still meets `deadline`: its exact latest safe start, plus one engine step."""
    return deadline - settings.safety_margin - settings.restart_duration + settings.step


def plan(
    entries: Iterable[FleetEntry],
    history: Iterable[RestartRecord],
    limits: BudgetLimits,
    settings: PlanSettings,
    now: float,
    windows: Windows | None = None,
    *,
    explain: bool = True,
) -> Plan:
    """The restart schedule of every fleet in `entries` (those that want a restart and are not in flight).

    `explain=False` leaves the reasons empty (the fleet simulator plans thousands of entries often).
    """
    windows = windows or Windows()
    state = BudgetState(history, now=now, assumed_duration=settings.restart_duration)
    by_fleet: dict[str, list[FleetEntry]] = defaultdict(list)
    for entry in entries:
        if entry.wants_restart and state.in_flight(entry.instance) is None:
            by_fleet[entry.fleet].append(entry)
    planned: list[PlanEntry] = []
    problems: list[str] = []
    for fleet in sorted(by_fleet):
        fleet_plan, fleet_problems = _plan_fleet(
            fleet, by_fleet[fleet], state, limits, settings, now, windows, explain
        )
        planned.extend(fleet_plan)
        problems.extend(fleet_problems)
    planned.sort(key=lambda e: (e.slot_at, e.fleet, e.instance))
    return Plan(computed_at=now, entries=tuple(planned), problems=tuple(problems))


def _plan_fleet(
    fleet: str,
    entries: list[FleetEntry],
    history: BudgetState,
    limits: BudgetLimits,
    settings: PlanSettings,
    now: float,
    windows: Windows,
    explain: bool,
) -> tuple[list[PlanEntry], list[str]]:
    state = history.copy()
    hashes = {e.instance: stable_hash(e.instance) for e in entries}
    gap = limits.gap(settings.restart_duration)
    timed = [e for e in entries if e.deadline is not None]
    asap = deque(
        sorted(
            (e for e in entries if e.deadline is None),
            key=lambda e: (e.requested_at if e.requested_at is not None else now, hashes[e.instance]),
        )
    )
    # `timed` holds the entries with a deadline, which mypy cannot see through the list
    latest = {e.instance: latest_start(e.deadline, settings) for e in timed}  # type: ignore[arg-type]

    # backward pass: as late as possible, one gap apart, inside windows
    tentative: dict[str, float] = {}
    next_slot = math.inf
    for backward in sorted(
        timed, key=lambda e: (latest[e.instance], e.deadline, hashes[e.instance]), reverse=True
    ):
        slot = windows.latest_at_or_before(min(latest[backward.instance], next_slot - gap))
        tentative[backward.instance] = slot
        next_slot = slot

    # forward pass: through the real budget, earliest first; free slots go to requests without deadline
    out: list[PlanEntry] = []
    problems: list[str] = []
    asap_cursor = now  # requests without deadline are served in order
    blocked_until = now  # everything before this is taken for the whole fleet: no need to search it again
    previous: str | None = None
    ordered = sorted(
        timed, key=lambda e: (tentative[e.instance], latest[e.instance], e.deadline, hashes[e.instance])
    )
    for entry in [*ordered, None]:
        target = tentative[entry.instance] if entry is not None else math.inf
        while asap:
            candidate = asap[0]
            slot, why, _, code = earliest_start(
                state, fleet, candidate.instance, max(asap_cursor, now), limits, windows
            )
            if entry is not None and slot + gap > target:
                break
            asap.popleft()
            out.append(_entry(candidate, slot, None, previous, (why, code), settings, explain))
            previous, asap_cursor = candidate.instance, slot
            _occupy(state, candidate, slot, settings)
        if entry is None:
            break
        wanted = max(target, now, blocked_until)
        slot, why, fleet_wide, code = earliest_start(state, fleet, entry.instance, wanted, limits, windows)
        if fleet_wide and slot > blocked_until:
            blocked_until = slot
        pushed = (why, code) if slot > max(target, now) else (None, None)
        # `entry` is from `timed`: its deadline is set
        hopeless = slot + settings.restart_duration > entry.deadline  # type: ignore[operator]
        planned = _entry(entry, slot, latest[entry.instance], previous, pushed, settings, explain, hopeless)
        out.append(planned)
        if (planned.late or hopeless) and explain:
            problems.append(_late_problem(planned, fleet, len(timed), gap, settings))
        if not hopeless:
            previous = entry.instance
            _occupy(state, entry, slot, settings)
    return out, problems


def earliest_start(
    state: BudgetState, fleet: str, instance: str, t: float, limits: BudgetLimits, windows: Windows
) -> tuple[float, str | None, bool, str | None]:
    """The first time at or after `t` that both the budget and the windows allow; why it moved;
    whether only fleet-wide limits moved it (then every time before it is taken for everyone); and
    the code of the last limit that moved it (`cooldown`, `min-interval`, ..., `window`)."""
    why = code = None
    fleet_wide = True
    for _ in range(100_000):
        decision = admit(state, fleet, instance, t, limits)
        if decision.ok:
            opened = windows.next_open(t)
            if opened == t:
                return t, why, fleet_wide, code
            why, code = f"outside the restart windows ({windows.describe()})", "window"
            t = opened
            if not math.isfinite(t):
                return t, why, fleet_wide, code
            continue
        why, code = decision.reason, decision.code
        if decision.retry_at is None:
            return math.inf, why, False, code
        fleet_wide = fleet_wide and decision.code in FLEET_WIDE
        t = max(decision.retry_at, t + 1e-6)
    return math.inf, why, False, code


def _occupy(state: BudgetState, entry: FleetEntry, slot: float, settings: PlanSettings) -> None:
    state.add(
        RestartRecord(
            instance=entry.instance,
            fleet=entry.fleet,
            holder=entry.agent,
            started_at=slot,
            finished_at=slot + settings.restart_duration,
            outcome="planned",
        )
    )


def _entry(
    entry: FleetEntry,
    slot: float,
    latest: float | None,
    previous: str | None,
    pushed: tuple[str | None, str | None],
    settings: PlanSettings,
    explain: bool = True,
    hopeless: bool = False,
) -> PlanEntry:
    why, held_by = pushed
    due = None if latest is None or entry.deadline is None else on_time_until(entry.deadline, settings)
    late = due is not None and slot > due
    if not explain:
        reason = ""
    elif latest is None:
        reason = f"{entry.kind or 'restart'} requested {at(entry.requested_at)}: no deadline, first free slot"
    else:
        reason = (
            f"{entry.kind or 'restart'}: OOM projected {at(entry.deadline)}; must start by {at(latest)} "
            f"(margin {span(settings.safety_margin)}, a restart takes ~{span(settings.restart_duration)})"
        )
    if explain:
        reason += f"; slot {at(slot)}"
        if previous:
            reason += f", after {previous}"
        if hopeless:
            reason += (
                "; CANNOT BE SAVED: the earliest slot ends after the projected OOM, so it is left to "
                "instances that can still be saved (this one will be OOM-killed and restart by itself)"
            )
        elif late:
            # `late` is only true with a `due`
            reason += f"; LATE by {span(slot - due + settings.step)}"  # type: ignore[operator]
        if why:
            reason += f" ({why})"
    return PlanEntry(
        instance=entry.instance,
        fleet=entry.fleet,
        agent=entry.agent,
        slot_at=slot,
        latest_start=latest,
        deadline=entry.deadline,
        kind=entry.kind,
        finding_id=entry.finding_id,
        late=late,
        reason=reason,
        after=previous,
        hopeless=hopeless,
        held_by=held_by,
    )


def _late_problem(entry: PlanEntry, fleet: str, count: int, gap: float, settings: PlanSettings) -> str:
    if not math.isfinite(entry.slot_at):
        when = "no slot can be found"
    elif entry.hopeless:
        when = (
            f"even its earliest slot {at(entry.slot_at)} ends after the projected OOM, so it is not planned"
        )
    else:
        when = (
            f"its earliest slot {at(entry.slot_at)} is after its latest safe start {at(entry.latest_start)}"
        )
    return (
        f"{entry.instance} (fleet {fleet}) cannot be restarted before its deadline {at(entry.deadline)}: "
        f"{when}. {count} deadline restart(s) spaced {span(gap)} need {span(count * gap)}; raise the "
        f"budget (max_concurrent, min_interval, max_per_hour), widen the windows or shorten the safety "
        f"margin ({span(settings.safety_margin)}). Restarting in deadline order meanwhile."
    )
