"""Process lifetimes and the lower/upper envelope of a series, in buckets aligned to the epoch.

The minimum of each bucket is the lower envelope: the floor a GC or a batch returns to, which
sawtooth and short bursts do not move. The maximum is the upper envelope: where the peaks
are, which is what meets the memory limit first. Buckets never straddle a restart: each
process lifetime has its own, so a leak is judged within one lifetime.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from itertools import pairwise
from operator import itemgetter

from agent.detect.coverage import sample_spans
from agent.detect.model import RSS, START_TIME, InstanceSeries, Points
from agent.detect.params import DetectParams
from agent.detect.trend import _kernels


def _buckets(times: list[float], width: float) -> tuple[list[int], list[int], list[int]]:
    """(bucket indices, firsts, ends) of the non-empty buckets of the sorted `times`: sample i is
    in bucket `int(times[i] // width)`. One bisection per bucket, not a step per sample."""
    n = len(times)
    idx: list[int] = []
    firsts: list[int] = []
    i = 0
    while i < n:
        b = int(times[i] // width)
        j = bisect_left(times, (b + 1) * width, i + 1)
        while j < n and int(times[j] // width) == b:  # where rounding puts the cut on the wrong side
            j += 1
        while j > i + 1 and int(times[j - 1] // width) != b:
            j -= 1
        idx.append(b)
        firsts.append(i)
        i = j
    return idx, firsts, [*firsts[1:], n]


def _floors_and_peaks(
    values: list[float], firsts: list[int], ends: list[int]
) -> tuple[list[float], list[float]]:
    chunks = list(map(values.__getitem__, map(slice, firsts, ends)))
    return list(map(min, chunks)), list(map(max, chunks))


@dataclass(slots=True)
class Bucketed:
    """Samples cut into buckets of `width` regardless of lifetimes: each bucket's index, the
    range of its samples, and its floor and peak."""

    times: list[float]
    values: list[float]
    idx: list[int]
    first: list[int]
    end: list[int]
    lo: list[float]
    hi: list[float]


def bucketize(points: Points, width: float) -> Bucketed:
    times = list(map(itemgetter(0), points))
    values = list(map(itemgetter(1), points))
    return Bucketed(times, values, *_cut(times, values, width))


def _cut(
    times: list[float], values: list[float], width: float
) -> tuple[list[int], list[int], list[int], list[float], list[float]]:
    """(indices, firsts, ends, floors, peaks) of the buckets of `width` of sorted samples
    (`_kernels.bucket_floors` in C, `_buckets` and `_floors_and_peaks` in Python)."""
    found = _kernels.bucket_floors(times, values, width) if _kernels is not None else None
    if found is not None:
        idx, firsts, lo, hi = found
        return idx, firsts, [*firsts[1:], len(times)], lo, hi
    idx, firsts, ends = _buckets(times, width)
    return idx, firsts, ends, *_floors_and_peaks(values, firsts, ends)


RESTART_DROP = 0.25  # a floor this fraction below the last hour's floors...
RESTART_UNDO = 0.75  # ...that gives back at least this much of the lifetime's rise is a restart
HELD_BUCKETS = 4  # the memory given back was held this many buckets (a burst's was not)


def infer_restarts(
    series: InstanceSeries, params: DetectParams, memory: Bucketed | None = None
) -> list[float]:
    """Times at which a new process lifetime began, from what the samples show.

    Explicit `series.restarts` win. Otherwise a restart is a change of
    `process_start_time_seconds`, a gap longer than `params.gap` in the memory samples, or a
    bucket whose floor falls below `params.reset_drop` of the previous bucket's, or falls by
    `RESTART_DROP` below every floor of the last `HELD_BUCKETS` buckets while giving back at
    least `RESTART_UNDO` of what the lifetime's floor rose since its lowest (an orchestrator's
    restart returns to the cold level; a burst that ends gives back memory it held for minutes,
    a reload that shrinks the model a part of the level); the restart is the first sample below
    the cut. A start-time change that follows a restart the memory already showed, since the
    new start time, is that restart. Every rule looks only at earlier samples, so the online path
    finds the same restarts as a replay. `memory` is the RSS already bucketed, if at hand.
    """
    if series.restarts is not None:
        return sorted(series.restarts)
    changes: list[tuple[float, float]] = []  # (sample that shows it, the new start time)
    starts = series.series.get(START_TIME) or []
    for (_, before), (ts, after) in pairwise(starts):
        if abs(after - before) > 1.0:
            changes.append((ts, after))
    if memory is None:
        points = series.series.get(RSS) or next((p for p in series.series.values() if p), [])
        memory = bucketize(points, params.bucket)
    times, values = memory.times, memory.values
    if not times:
        return sorted(ts for ts, _ in changes)
    gap_times = {first for first, _ in sample_spans(times, params.gap, key=None)[1:]}
    found = set(gap_times)
    recent: list[float] = []  # the floors of the current lifetime's last buckets
    lowest = None  # the lifetime's lowest floor so far
    for i, j, floor in zip(memory.first, memory.end, memory.lo, strict=True):
        if times[i] in gap_times:
            recent, lowest = [], None
        cut = None
        if recent and floor < params.reset_drop * recent[-1]:
            cut = params.reset_drop * recent[-1]
        elif len(recent) >= HELD_BUCKETS and lowest is not None:
            held = min(recent[-HELD_BUCKETS:])
            if floor < (1 - RESTART_DROP) * held and recent[-1] - floor >= RESTART_UNDO * (
                recent[-1] - lowest
            ):
                cut = (1 - RESTART_DROP) * held
        if cut is not None:
            found.add(next(times[k] for k in range(i, j) if values[k] < cut))
            recent, lowest = [], None
        recent.append(floor)
        lowest = floor if lowest is None else min(lowest, floor)
    shown = sorted(found)
    for ts, after in changes:
        k = bisect_left(shown, after - params.bucket)
        if k < len(shown) and shown[k] <= ts:
            continue  # the memory showed this restart already
        found.add(ts)
    return sorted(found)


@dataclass(slots=True)
class Envelope:
    """Per lifetime: bucket indices (ts // width) with the min and max of each bucket."""

    width: float
    idx: list[list[int]]
    lo: list[list[float]]
    hi: list[list[float]]

    def select(self, life: int, first: int, end: int) -> tuple[list[int], list[float], list[float]]:
        """The buckets of lifetime `life` with `first <= index < end`."""
        idx = self.idx[life]
        i, j = bisect_left(idx, first), bisect_left(idx, end)
        return idx[i:j], self.lo[life][i:j], self.hi[life][i:j]

    def floors(self, life: int, first: int, end: int) -> tuple[list[int], list[float]]:
        """`select` without the maxima: what the fits read, thousands of times a replay."""
        idx = self.idx[life]
        i, j = bisect_left(idx, first), bisect_left(idx, end)
        return idx[i:j], self.lo[life][i:j]

    def coarse(self, factor: int) -> Envelope:
        """The envelope in buckets `factor` times wider (min of mins, max of maxes)."""
        if factor == 1:
            return self
        out = Envelope(self.width * factor, [], [], [])
        for idx, lo, hi in zip(self.idx, self.lo, self.hi):
            c_idx: list[int] = []
            c_lo: list[float] = []
            c_hi: list[float] = []
            for b, low, high in zip(idx, lo, hi):
                g = b // factor
                if c_idx and c_idx[-1] == g:
                    if low < c_lo[-1]:
                        c_lo[-1] = low
                    if high > c_hi[-1]:
                        c_hi[-1] = high
                else:
                    c_idx.append(g)
                    c_lo.append(low)
                    c_hi.append(high)
            out.idx.append(c_idx)
            out.lo.append(c_lo)
            out.hi.append(c_hi)
        return out


def build_envelope(
    points: Points, width: float, starts: list[float], bucketed: Bucketed | None = None
) -> Envelope:
    """Bucket `points` (sorted by time) per lifetime; `starts` are the lifetime start times.
    With one lifetime, `bucketed` (the same points already cut into buckets of `width`) is used."""
    if bucketed is not None and len(starts) == 1:
        return Envelope(width, [bucketed.idx], [bucketed.lo], [bucketed.hi])
    env = Envelope(width, [], [], [])
    times = list(map(itemgetter(0), points))
    values = list(map(itemgetter(1), points))
    for life, _start in enumerate(starts):
        first = bisect_left(times, starts[life]) if life else 0
        end = bisect_left(times, starts[life + 1]) if life + 1 < len(starts) else len(times)
        idx, _, _, lo, hi = _cut(times[first:end], values[first:end], width)
        env.idx.append(idx)
        env.lo.append(lo)
        env.hi.append(hi)
    return env
