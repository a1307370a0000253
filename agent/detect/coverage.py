"""When a replay's judgement can see a sample at all, so that it skips the empty stretches between
samples (a process stopped for a week, a clock that read 1980 before it was set) instead of judging
each of their ticks to nothing.

A judgement at `t` reads only samples in `[t - back, t + ahead]` (its windows): where a series has
none, every detector answers "unknown", which changes no finding, so the ticks there can be left
out. The spans of a series are found by bisection, which costs O(duration / back · log n) instead of
reading every point: a replay of weeks of one-minute samples pays a few thousand comparisons per
series for it.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any

Interval = tuple[float, float]
_time = itemgetter(0)


def sample_spans(
    points: Sequence[Any], gap: float, key: Callable[[Any], float] | None = _time
) -> list[Interval]:
    """`(first, last)` of each run of `points` (sorted by time) with no gap wider than `gap` inside;
    `key` reads a point's time (default: `(ts, value)` pairs; None: the points are times).

    From each point it jumps to the last one within `gap` of it (a bisection): two jumps cover at
    least `gap` of time, so a dense series costs O(duration / gap · log n), not a look at each point."""
    n = len(points)
    if n == 0:
        return []
    at = key or float
    spans, first, i = [], 0, 0
    while i < n - 1:
        j = bisect_right(points, at(points[i]) + gap, lo=i + 1, key=key) - 1
        if j > i:
            i = j
            continue
        spans.append((at(points[first]), at(points[i])))  # the next point is more than `gap` away
        first = i = i + 1
    spans.append((at(points[first]), at(points[-1])))
    return spans


def seen_from(
    series: Iterable[Sequence[Any]], back: float, ahead: float, key: Callable[[Any], float] | None = _time
) -> list[Interval]:
    """The instants `t` at which one of the series has a sample in `[t - back, t + ahead]`, as
    sorted, disjoint intervals (`key` as for `sample_spans`)."""
    return union(
        (first - ahead, last + back) for points in series for first, last in sample_spans(points, back, key)
    )


def union(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of closed intervals, as sorted, disjoint intervals."""
    merged: list[Interval] = []
    for lo, hi in sorted(intervals):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def steps_seen(intervals: Sequence[Interval], width: float, first: int, last: int) -> Iterator[int]:
    """The step numbers `k` from `first` to `last` whose instant `k * width` is in `intervals`,
    and one step more on each side of each interval (rounding never drops a tick that sees)."""
    done = first - 1
    for lo, hi in intervals:
        start = max(done + 1, math.floor(lo / width) - 1)
        end = min(last, math.ceil(hi / width) + 1)
        if start <= end:
            yield from range(start, end + 1)
            done = end
        if done >= last:
            return


class Sight:
    """Whether an instant is in `intervals`, asked for instants that only increase."""

    __slots__ = ("_at", "_intervals")

    def __init__(self, intervals: Sequence[Interval]) -> None:
        self._intervals = intervals
        self._at = 0

    def sees(self, t: float) -> bool:
        intervals = self._intervals
        while self._at < len(intervals) and intervals[self._at][1] < t:
            self._at += 1
        return self._at < len(intervals) and intervals[self._at][0] <= t
