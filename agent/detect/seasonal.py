"""The daily profile of a series: traffic-driven rise and fall that repeats every day.

A rise over the afternoon looks like a leak to any trend test shorter than a day. The profile
is learned from the lower envelope of the previous `season_days` complete days (across process
lifetimes: the daily cycle belongs to the traffic, not to the process), in the very buckets it
is later subtracted from (a floor taken over wider buckets sits at a different phase), and
removed before judging a trend. Each day's level is removed first, and so is the drift within
a day (the change from one day to the next at the same time of day, where the cycle cancels
exactly), so a leak that runs through the learning days does not teach the profile a daily
ramp. Every figure is a median over days, so one odd day (a restart, a reload, a long
batch) does not shape it; hence at least three complete days are needed, and until then the
detectors say nothing is known.
"""

from __future__ import annotations

import itertools
import math
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import sub
from typing import Any

from agent.core.figures import is_number
from agent.detect.params import DAY
from agent.detect.trend import median, medians

MAX_SLOTS = 1440  # a profile finer than a minute a day is not a profile (and bounds what peers send)
MAX_WARMUP = 2 * DAY  # growth for longer than this after a start is not a warm-up

MIN_DAYS = 3
MIN_COVERAGE = 0.8  # a day counts when this fraction of its slots has data
SIGNIFICANT = 7.0  # the profile's range must exceed this many standard errors of a slot, else it is flat


@dataclass(frozen=True, slots=True)
class Profile:
    values: tuple[float, ...]  # one per bucket of the period (bucket index modulo their number)
    amplitude: float
    noise: float
    days: int
    relative: bool = False  # values (amplitude, noise) are fractions of the level: a workload's prior

    def offset(self, bucket: int) -> float:
        return self.values[bucket % len(self.values)]


def learn_profile(
    idx: list[int],
    lows: list[float],
    width: float,
    day_start: float,
    season_days: int,
    period: float,
    restarts: Sequence[float] = (),
    settle: float = 0.0,
) -> Profile | None:
    """The profile for the period starting at `day_start`, from buckets of `width` (`idx` sorted).

    Only buckets before `day_start` are used, and no day that `settle` seconds after one of the
    `restarts` reach into: what the process does after its start (a warm-up, a cache filling, a
    leak starting again from nothing) belongs to the process, not to the traffic, and a process
    restarted about daily would teach its own sawtooth as the daily cycle. None when the buckets
    do not tile the period or fewer than `MIN_DAYS` complete periods exist.
    """
    count = period / width
    slots = round(count)
    if abs(count - slots) > 1e-6 or slots < 4:
        return None
    first_day = math.floor(day_start / period + 1e-9) - season_days
    unsettled = {
        day
        for start in restarts
        for day in range(math.floor(start / period + 1e-9), math.floor((start + settle) / period + 1e-9) + 1)
    }
    per_day: dict[int, list[float]] = {}
    for day in range(first_day, first_day + season_days):
        found = _day_values(idx, lows, day, slots) if day not in unsettled else None
        if found is not None:
            per_day[day] = found
    days = sorted(per_day)
    if len(days) < MIN_DAYS:
        return None
    drift = _drift(per_day, days)
    ramp = [drift * ((slot + 0.5) / slots - 0.5) for slot in range(slots)]
    # every day complete (the common case): no NaN to step around, so no Python-level filtering
    complete = not any(map(math.isnan, itertools.chain.from_iterable(per_day.values())))
    rows = []  # per day: value - the day's level - the drift's share at that time (NaN: no data)
    for day in days:
        found = per_day[day]
        level = median(found if complete else _present(found))
        rows.append(list(map(sub, map(sub, found, repeat(level, slots)), ramp)))
    if complete:
        values = medians(zip(*rows), len(rows))
    else:
        values = [median(present) if (present := _present(column)) else 0.0 for column in zip(*rows)]
    centre = median(values)
    values = [v - centre for v in values]
    # noise of one day's value, from day-to-day differences of the same slot (unbiased by the fit)
    diffs = itertools.chain.from_iterable(map(abs, map(sub, r2, r1)) for r1, r2 in itertools.pairwise(rows))
    pairs = list(diffs) if complete else _present(diffs)
    noise = 1.4826 * median(pairs) / math.sqrt(2.0) if pairs else 0.0
    amplitude = max(values) - min(values)
    if amplitude <= SIGNIFICANT * noise / math.sqrt(len(days)):
        return Profile((0.0,) * slots, 0.0, noise, len(days))
    return Profile(tuple(values), amplitude, noise, len(days))


def _present(values: Iterable[float]) -> list[float]:
    """`values` without NaN (a slot with no data)."""
    return [v for v in values if v == v]


def _day_values(idx: list[int], lows: list[float], day: int, slots: int) -> list[float] | None:
    """The floor of each slot of one day (NaN where it has no data), or None when fewer than
    `MIN_COVERAGE` of its slots have data. A slot seen twice (a restart) keeps its lower floor."""
    first = bisect_left(idx, day * slots)
    end = bisect_left(idx, (day + 1) * slots)
    if end - first < MIN_COVERAGE * slots:
        return None
    if end - first == slots and idx[end - 1] - idx[first] == slots - 1:
        return list(lows[first:end])  # complete and in order: the common case
    found = [math.nan] * slots
    for i in range(first, end):
        slot = idx[i] - day * slots
        value = lows[i]
        if not value >= found[slot]:  # true when found[slot] is NaN or larger
            found[slot] = value
    present = sum(1 for v in found if v == v)
    return found if present >= MIN_COVERAGE * slots else None


def _drift(per_day: dict[int, list[float]], days: list[int]) -> float:
    """Growth per day: each pair of consecutive days gives the median change at equal times of
    day; pairs that disagree in sign give 0, else the smallest one counts (a reload or restart
    between two days must not pass for a daily ramp)."""
    per_pair = []
    for d1, d2 in itertools.pairwise(days):
        changes = [c for c in map(sub, per_day[d2], per_day[d1]) if c == c]
        if changes:
            per_pair.append(median(changes) / (d2 - d1))
    if not per_pair or (min(per_pair) < 0 < max(per_pair)):
        return 0.0
    return min(per_pair, key=abs)


@dataclass(frozen=True, slots=True)
class WorkloadProfile:
    """A workload's daily profile (one value per slot of `slot_seconds`, as a fraction of the
    level, median 0), its typical floor after warm-up, how long warm-ups last, and how much it
    stands on. Small enough to share through the coordinator (under 2 KiB as JSON)."""

    daily: tuple[float, ...]
    slot_seconds: float
    level: float
    warmup: float
    noise: float  # one slot's noise, fraction of the level
    lifetimes: int
    days: int
    learned_until: float | None = None
    """The end of the history it was learned from, when that is the judged series' own: it then
    speaks only for lifetimes that began after it. None: learned elsewhere (peers, Prometheus)."""

    def profile(self, width: float, period: float) -> Profile | None:
        """The daily profile in buckets of `width`, relative to the level (`Profile.relative`):
        None when `width` is not a whole number of slots or the slots do not tile `period`."""
        slots = len(self.daily)
        if not self.daily or abs(slots * self.slot_seconds - period) > 1e-6 * period:
            return None
        factor = width / self.slot_seconds
        per = round(factor)
        if per < 1 or abs(factor - per) > 1e-6 or slots % per:
            return None
        # a wider bucket's floor is the lowest of its slots' floors
        values = [min(self.daily[g * per : (g + 1) * per]) for g in range(slots // per)]
        centre = median(values)
        values = [v - centre for v in values]
        amplitude = max(values) - min(values)
        if amplitude <= 0:
            return Profile((0.0,) * len(values), 0.0, self.noise, self.days, relative=True)
        return Profile(tuple(values), amplitude, self.noise, self.days, relative=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "daily": [round(v, 6) for v in self.daily],
            "slot_seconds": self.slot_seconds,
            "level": self.level,
            "warmup": self.warmup,
            "noise": round(self.noise, 6),
            "lifetimes": self.lifetimes,
            "days": self.days,
        }

    @classmethod
    def from_dict(cls, doc: Any) -> WorkloadProfile:
        """A profile as a peer or a file sent it; ValueError (one line) on anything out of bounds."""
        if not isinstance(doc, Mapping):
            raise ValueError("a workload profile must be an object")
        daily = doc.get("daily")
        if not isinstance(daily, list) or not 4 <= len(daily) <= MAX_SLOTS:
            raise ValueError(f"daily must be a list of 4 to {MAX_SLOTS} numbers")
        values = tuple(_number(v, "daily", -1.0, 1.0) for v in daily)
        slot = _number(doc.get("slot_seconds"), "slot_seconds", 1.0, DAY)
        level = _number(doc.get("level"), "level", 0.0, 2.0**50)
        warmup = _number(doc.get("warmup"), "warmup", 0.0, MAX_WARMUP)
        noise = _number(doc.get("noise"), "noise", 0.0, 1.0)
        lifetimes = int(_number(doc.get("lifetimes"), "lifetimes", 0, 10**6))
        days = int(_number(doc.get("days"), "days", 0, 10**4))
        return cls(values, slot, level, warmup, noise, lifetimes, days)


def _number(raw: Any, name: str, lo: float, hi: float) -> float:
    if not is_number(raw):
        raise ValueError(f"{name} must be a finite number")
    if not lo <= raw <= hi:
        raise ValueError(f"{name} must be between {lo:g} and {hi:g}")
    return float(raw)
