"""The restart budget: pure functions of (restarts so far, a time) that say whether a restart may
start, and if not, why and when it could.

Four limits, all per fleet except the cooldown, which is per instance:
  max_concurrent  restarts in flight at once (a restart is in flight until verified or timed out)
  min_interval    between the starts of two restarts
  max_per_hour    starts in any sliding hour (`hour`: shorter on a compressed time axis)
  cooldown        after an instance's last restart ended, before it may be restarted again

The state comes from the coordinator (every agent's restarts), so it survives an agent restart.
Dry-run's would-be restarts (`WOULD_RESTART`) count like restarts for the fleet-wide limits, as
enforce mode's real ones would, but never for the instance's own cooldown: its process was not
restarted. Nothing here reads a clock: tests drive it with tables of times.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from remediation.model import WOULD_RESTART, Decision, RestartRecord
from remediation.text import at, span

HOUR = 3600.0
STAGE = "budget"


@dataclass(frozen=True, slots=True)
class BudgetLimits:
    max_concurrent: int = 1
    min_interval: float = 600.0
    max_per_hour: int | None = 6  # None: no hourly limit
    cooldown: float = 3600.0
    hour: float = HOUR  # the window of max_per_hour: `agent.time_scale` compresses it as the rest

    def __post_init__(self) -> None:
        if self.max_concurrent < 1:
            raise ValueError("max_concurrent must be at least 1")
        if self.max_per_hour is not None and self.max_per_hour < 1:
            raise ValueError("max_per_hour must be at least 1 (or None for no hourly limit)")
        if self.min_interval < 0 or self.cooldown < 0 or not self.hour > 0:
            raise ValueError("min_interval and cooldown must not be negative, and the hour must be positive")

    def describe(self) -> str:
        """The budget in one line, the one text `medic plan`, the dashboard and the API show."""
        at_once = f"{self.max_concurrent} restart{'s' if self.max_concurrent > 1 else ''} at a time"
        apart = f"starts {span(self.min_interval)} apart" if self.min_interval > 0 else "no spacing"
        hourly = f"at most {self.max_per_hour} an hour" if self.max_per_hour else "no hourly limit"
        cooldown = f"cooldown {span(self.cooldown)} per instance" if self.cooldown > 0 else "no cooldown"
        return f"{at_once}, {apart}, {hourly}, {cooldown}"

    def gap(self, restart_duration: float) -> float:
        """The even spacing between starts that keeps every fleet-wide limit on a long run."""
        hourly = self.hour / self.max_per_hour if self.max_per_hour else 0.0
        return max(self.min_interval, restart_duration / self.max_concurrent, hourly)


@dataclass(slots=True)
class _Fleet:
    starts: list[float] = field(default_factory=list)  # sorted
    intervals: list[tuple[float, float, str]] = field(
        default_factory=list
    )  # (start, end, instance), by start
    longest: float = 0.0
    starters: dict[float, str] = field(default_factory=dict)


class BudgetState:
    """The restarts a budget decision looks at, indexed for quick checks.

    A finished restart occupies [started_at, finished_at); one still in flight is assumed to end at
    `started_at + assumed_duration`, and not before `now + 1 s` (it is running now). The planner
    works on a `copy()` and `add()`s the restarts it plans; callers never see those.
    """

    def __init__(self, records: Iterable[RestartRecord] = (), *, now: float, assumed_duration: float = 300.0):
        self.now = now
        self.assumed_duration = assumed_duration
        self._fleets: dict[str, _Fleet] = {}
        self._last_end: dict[str, float] = {}  # instance -> end (or start) of its latest restart
        self._in_flight: dict[str, RestartRecord] = {}
        for record in sorted(records, key=lambda r: (r.started_at, r.instance)):
            self.add(record)

    def copy(self) -> BudgetState:
        clone = BudgetState(now=self.now, assumed_duration=self.assumed_duration)
        for name, fleet in self._fleets.items():
            clone._fleets[name] = _Fleet(
                list(fleet.starts), list(fleet.intervals), fleet.longest, dict(fleet.starters)
            )
        clone._last_end = dict(self._last_end)
        clone._in_flight = dict(self._in_flight)
        return clone

    def add(self, record: RestartRecord) -> None:
        fleet = self._fleets.setdefault(record.fleet, _Fleet())
        if record.finished_at is None:
            end = max(record.started_at + self.assumed_duration, self.now + 1.0)
            self._in_flight[record.instance] = record
        else:
            end = max(record.finished_at, record.started_at)
        bisect.insort(fleet.starts, record.started_at)
        bisect.insort(fleet.intervals, (record.started_at, end, record.instance))
        fleet.longest = max(fleet.longest, end - record.started_at)
        fleet.starters[record.started_at] = record.instance
        if record.outcome == WOULD_RESTART:
            return  # nothing was restarted: no cooldown for the instance
        previous = self._last_end.get(record.instance)
        self._last_end[record.instance] = max(end, previous) if previous is not None else end

    def in_flight(self, instance: str) -> RestartRecord | None:
        return self._in_flight.get(instance)

    def running_at(self, fleet: str, t: float) -> list[tuple[float, float, str]]:
        """Restarts of `fleet` that occupy time `t`."""
        index = self._fleets.get(fleet)
        if index is None:
            return []
        lo = bisect.bisect_left(index.intervals, (t - index.longest, -math.inf, ""))
        hi = bisect.bisect_right(index.intervals, (t, math.inf, "\uffff"))
        return [iv for iv in index.intervals[lo:hi] if iv[0] <= t < iv[1]]

    def starts_between(self, fleet: str, lo: float, hi: float) -> list[float]:
        """Start times in (lo, hi] of `fleet`, oldest first."""
        index = self._fleets.get(fleet)
        if index is None:
            return []
        return index.starts[bisect.bisect_right(index.starts, lo) : bisect.bisect_right(index.starts, hi)]

    def neighbours(self, fleet: str, t: float) -> tuple[float | None, float | None]:
        """The latest start at or before `t` and the earliest start after it."""
        index = self._fleets.get(fleet)
        if index is None or not index.starts:
            return None, None
        i = bisect.bisect_right(index.starts, t)
        return (index.starts[i - 1] if i else None), (index.starts[i] if i < len(index.starts) else None)

    def started_by(self, fleet: str, start: float) -> str:
        index = self._fleets.get(fleet)
        return index.starters.get(start, "?") if index else "?"

    def last_end(self, instance: str) -> float | None:
        return self._last_end.get(instance)


def admit(state: BudgetState, fleet: str, instance: str, t: float, limits: BudgetLimits) -> Decision:
    """May `instance` of `fleet` start a restart at time `t`? If not: the first limit hit, and when to retry."""
    running = state.in_flight(instance)
    if running is not None and running.started_at <= t:
        return Decision.block(
            STAGE,
            "in-flight",
            f"{instance} is already being restarted by {running.holder} since {at(running.started_at)}",
            None,
        )
    busy = state.running_at(fleet, t)
    if len(busy) >= limits.max_concurrent:
        ends = sorted(end for _, end, _ in busy)
        names = ", ".join(sorted(name for _, _, name in busy))
        return Decision.block(
            STAGE,
            "max-concurrent",
            f"fleet {fleet} has {len(busy)} restart(s) in flight ({names}); max_concurrent is "
            f"{limits.max_concurrent}",
            ends[len(busy) - limits.max_concurrent],
            in_flight=len(busy),
        )
    if limits.min_interval > 0:
        before, after = state.neighbours(fleet, t)
        if before is not None and t - before < limits.min_interval:
            return Decision.block(
                STAGE,
                "min-interval",
                f"the last restart in fleet {fleet} ({state.started_by(fleet, before)}) started at "
                f"{at(before)}; min_interval is {span(limits.min_interval)}",
                before + limits.min_interval,
            )
        if after is not None and after - t < limits.min_interval:
            return Decision.block(
                STAGE,
                "min-interval",
                f"a restart in fleet {fleet} ({state.started_by(fleet, after)}) is planned at {at(after)}; "
                f"min_interval is {span(limits.min_interval)}",
                after + limits.min_interval,
            )
    if limits.max_per_hour is not None:
        hourly = _hourly(state, fleet, t, limits.max_per_hour, limits.hour)
        if hourly is not None:
            return hourly
    last = state.last_end(instance)
    if last is not None and limits.cooldown > 0 and t < last + limits.cooldown:
        return Decision.block(
            STAGE,
            "cooldown",
            f"{instance} was last restarted until {at(last)}; cooldown is {span(limits.cooldown)}",
            last + limits.cooldown,
        )
    return Decision.allow(STAGE, "within the restart budget")


def _hourly(state: BudgetState, fleet: str, t: float, limit: int, hour: float) -> Decision | None:
    """Would a start at `t` put `limit` + 1 starts in some sliding hour, before or after `t`?"""
    the_hour = "the hour" if hour == HOUR else f"the hour (compressed to {span(hour)})"
    before = state.starts_between(fleet, t - hour, t)
    if len(before) >= limit:
        return Decision.block(
            STAGE,
            "max-per-hour",
            f"fleet {fleet} had {len(before)} restarts in {the_hour} before {at(t)}; max_per_hour is {limit}",
            before[len(before) - limit] + hour,
        )
    for later in state.starts_between(fleet, t, t + hour - 1e-6):  # planned starts whose hour holds t
        if len(state.starts_between(fleet, later - hour, later)) >= limit:
            return Decision.block(
                STAGE,
                "max-per-hour",
                f"fleet {fleet} has {limit} restarts planned in {the_hour} up to {at(later)}; "
                f"max_per_hour is {limit}",
                later + 1e-6,
            )
    return None


FLEET_WIDE = frozenset({"max-concurrent", "min-interval", "max-per-hour"})
