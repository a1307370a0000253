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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import sub

from agent.detect.trend import median, medians

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
