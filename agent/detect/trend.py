"""Robust trend of a short sequence (a lower envelope): is it growing steadily, and how fast?

Why each step:
- level shifts (a model reload, a long batch) are removed first: a few isolated jumps that
  stand far out of the typical bucket-to-bucket change are subtracted, so a step that then
  stays flat is not growth. Many jumps in one window are a staircase leak and are kept.
- a window that has not visibly risen (the median of its last third is not above the median
  of its first third by more than the bucket-to-bucket noise) is not growing: this cheap test
  settles most judgements of healthy processes before the O(n²) fit.
- the slope is Theil-Sen (median of pairwise slopes), the significance Mann-Kendall's S
  counted from the same sorted slopes: both ignore a few odd buckets.
- growth that decelerates (warm-up filling a cache, working set reaching its plateau) shows a
  recent slope far below the window's slope.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import repeat
from operator import add, itemgetter, mul, sub, truediv

try:  # the O(n²) kernels in C, built with the package; the Python twins below are the reference
    from agent.detect import _kernels as _kernels  # exported: agent.series and slow.replay use it too
except ImportError:  # a source tree that was not built: same results, slower
    # mypy types the name as the module (its stub); None is the fallback every caller checks first
    _kernels = None  # type: ignore[assignment]

STEP_SIGMAS = 6.0  # a bucket-to-bucket change this many robust sigmas off the typical one is a step
MAX_STEPS = 2  # more jumps than this in one window are growth, not reloads
STEP_NEIGHBOURS = 3  # a step must stand out from this many changes on each side
STEP_HOLD = 8  # ... and this many points on each side must stay on their side of the jump's middle
STEP_PERSISTENCE = 0.8  # (at least this fraction of them: a long batch returns, a reload stays)
MAX_RHO = 0.9  # cap of the residual autocorrelation used to correct Mann-Kendall


@dataclass(slots=True)  # not frozen: made tens of thousands of times per replay, and never changed
class Trend:
    n: int
    span: float  # seconds between the first and the last point
    slope: float  # units per second, after removing steps
    recent_slope: float  # slope of the most recent third of the points
    early_slope: float  # slope of the first third
    z: float  # Mann-Kendall z (one-sided), corrected for autocorrelation of the residuals
    confidence: float  # Phi(z)
    autocorrelation: float  # lag-1 autocorrelation of the residuals around the line
    noise: float  # robust scale of the residuals around the fitted line
    steps: int  # level shifts removed
    level: float  # fitted value at the last point (step-corrected, in the original units)

    @property
    def decel(self) -> float:
        """Recent slope over the larger of the window's and the early slope: about 1 for steady
        growth (and above 1 for growth that began within the window), near 0 for a plateau."""
        reference = max(self.slope, self.early_slope)
        if reference <= 0:
            return 0.0
        return self.recent_slope / reference


def median(values: list[float]) -> float:
    found = _kernels.median(values) if _kernels is not None else None
    if found is not None:
        return found
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def medians(rows: Iterable[Iterable[float]], size: int) -> list[float]:
    """`median` of each of several rows of `size` values each, without a Python call per row."""
    ordered = list(map(sorted, rows))
    mid = size // 2
    if size % 2:
        return list(map(itemgetter(mid), ordered))
    return list(
        map(mul, repeat(0.5), map(add, map(itemgetter(mid - 1), ordered), map(itemgetter(mid), ordered)))
    )


def _median_sorted(ordered: list[float]) -> float:
    m = len(ordered)
    mid = m // 2
    return ordered[mid] if m % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


@dataclass(slots=True)  # not frozen, like Trend
class Steps:
    """A sequence with its level shifts removed, and whether it has visibly risen."""

    clean: list[float]
    count: int
    noise: float  # robust sigma of one point, from bucket-to-bucket changes
    # made on first use (the daily and cycle scales never ask); a cache, not part of the value
    _rise: float | None = field(default=None, compare=False)

    @property
    def rise(self) -> float:
        """Median of the last third minus median of the first third."""
        if self._rise is None:
            self._rise = thirds_rise(self.clean)
        return self._rise

    @property
    def risen(self) -> bool:
        return self.rise > self.noise


def thirds_rise(ys: list[float]) -> float:
    """Median of the last third of `ys` minus the median of its first third."""
    found = _kernels.thirds_rise(ys) if _kernels is not None else None
    if found is not None:
        return found
    k = max(2, len(ys) // 3)
    return _median_sorted(sorted(ys[-k:])) - _median_sorted(sorted(ys[:k]))


def remove_steps(ys: list[float], floor: float, raw_rise: float | None = None) -> Steps:
    """`ys` with isolated level shifts subtracted.

    A change counts as a shift when it is farther than `STEP_SIGMAS` robust sigmas and `floor`
    from the median change; if more than `MAX_STEPS` do, the series is left as it is.
    `raw_rise` is `thirds_rise(ys)` when already known.
    """
    found = _kernels.steps_removed(ys, floor) if _kernels is not None else None
    if found is not None:
        count, spread, cleaned = found
        if cleaned is None:
            return Steps(ys, 0, spread / math.sqrt(2.0), raw_rise)
        return Steps(cleaned, count, spread / math.sqrt(2.0), None)
    return _remove_steps(ys, floor, raw_rise)


def _remove_steps(ys: list[float], floor: float, raw_rise: float | None = None) -> Steps:
    """`remove_steps` in Python (`_kernels.steps_removed` in C)."""
    n = len(ys)
    diffs = list(map(sub, ys[1:], ys[:-1]))
    typical = _median_sorted(sorted(diffs))
    deviations = list(map(abs, map(sub, diffs, repeat(typical, n - 1))))
    spread = 1.4826 * _median_sorted(sorted(deviations))
    limit = max(STEP_SIGMAS * spread, floor)
    clean = ys
    count = 0
    if max(deviations) > limit:
        candidates = [i for i, dev in enumerate(deviations) if dev > limit]
        jumps = [i for i in candidates if _is_step(ys, diffs, i, candidates, limit)]
        if jumps and len(jumps) <= MAX_STEPS:
            count = len(jumps)
            clean = list(ys)
            shift = 0.0
            for i in range(n - 1):
                if i in jumps:
                    shift += diffs[i] - typical
                clean[i + 1] = ys[i + 1] - shift
    return Steps(clean, count, spread / math.sqrt(2.0), raw_rise if clean is ys else None)


def _is_step(ys: list[float], diffs: list[float], i: int, candidates: list[int], limit: float) -> bool:
    """Whether the large change `i` (between points i and i+1) is a level shift: it stands out
    from its neighbouring changes (a steep stretch of a daily cycle makes several large changes
    in a row, a step one) and the level stays shifted (a sawtooth of bucket floors drops and
    climbs back)."""
    k = STEP_NEIGHBOURS
    near = [
        diffs[j] for j in range(max(0, i - k), min(len(diffs), i + k + 1)) if j != i and j not in candidates
    ]
    if near and abs(diffs[i] - median(near)) <= limit:
        return False
    k = STEP_HOLD
    before, after = ys[max(0, i + 1 - k) : i + 1], ys[i + 1 : i + 1 + k]
    if min(len(before), len(after)) < k // 2:
        return False  # too close to an end to tell a step from a long batch
    middle = 0.5 * (ys[i] + ys[i + 1])
    up = diffs[i] > 0
    held = sum(1 for y in after if (y > middle) == up) + sum(1 for y in before if (y < middle) == up)
    return held >= STEP_PERSISTENCE * (len(before) + len(after))


def might_rise(ys: list[float], floor: float, raw_rise: float) -> bool:
    """A cheap necessary condition for `remove_steps(ys, floor).risen`, given `raw_rise =
    thirds_rise(ys)`.

    If the raw rise is not positive and no change falls more than `floor` below the median
    change (no downward step whose removal could lift the end), removing steps only lowers
    the end of the window, so the window has not risen.
    """
    if raw_rise > 0:
        return True
    diffs: list[float] = list(map(sub, ys[1:], ys[:-1]))
    return min(diffs) < _median_sorted(sorted(diffs)) - floor


def mann_kendall(ys: list[float]) -> tuple[int, float]:
    """Mann-Kendall S (later-minus-earlier pairs that rise, minus those that fall) and its z."""
    s = _kernels.mk_score(ys) if _kernels is not None else None
    if s is None:
        s = mk_score(ys)
    n = len(ys)
    var = n * (n - 1) * (2 * n + 5) / 18.0
    return s, ((s - math.copysign(1, s)) / math.sqrt(var) if s else 0.0)


def mk_score(ys: list[float]) -> int:
    """Mann-Kendall S in Python (`_kernels.mk_score` in C)."""
    seen: list[float] = []
    s = 0
    for count, y in enumerate(ys):
        s += bisect_left(seen, y) - (count - bisect_right(seen, y))
        insort(seen, y)
    return s


def slope_median(xs: list[float], ys: list[float]) -> float:
    """The median of the slopes of every pair of points (n ≥ 3): Theil-Sen's slope."""
    found = _kernels.slope_median(xs, ys) if _kernels is not None else None
    return found if found is not None else _median_sorted(_pair_slopes(xs, ys))


@lru_cache(maxsize=256)
def _pair_getters(n: int) -> tuple[itemgetter[tuple[int, ...]], itemgetter[tuple[int, ...]]]:
    first = [i for i in range(n - 1) for _ in range(i + 1, n)]
    second = [j for i in range(n - 1) for j in range(i + 1, n)]
    return itemgetter(*first), itemgetter(*second)


def _pair_slopes(xs: list[float], ys: list[float]) -> list[float]:
    """Sorted slopes of every pair of points (n ≥ 3)."""
    first, second = _pair_getters(len(xs))
    return sorted(map(truediv, map(sub, second(ys), first(ys)), map(sub, second(xs), first(xs))))


def theil_sen(xs: list[float], ys: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    if len(xs) == 2:
        return (ys[1] - ys[0]) / (xs[1] - xs[0])
    return slope_median(xs, ys)


def trend(xs: list[float], ys: list[float], steps: Steps, z: float) -> Trend:
    """The robust trend of `ys` at times `xs` (sorted, at least 4 points), steps removed;
    `z` is Mann-Kendall's for the step-free values.

    Mann-Kendall assumes independent points; a slow drift that wanders up for hours breaks
    that, so z is divided by the square root of the AR(1) variance inflation
    (1 + rho) / (1 - rho) of the residuals (rho = their lag-1 autocorrelation, when positive).
    """
    n = len(xs)
    clean = steps.clean
    slope = slope_median(xs, clean)
    x_mid, y_mid = _median_sorted(xs), median(clean)
    residuals = list(
        map(
            sub, map(sub, clean, repeat(y_mid, n)), map(mul, repeat(slope, n), map(sub, xs, repeat(x_mid, n)))
        )
    )
    noise = 1.4826 * median(list(map(abs, residuals)))
    energy = sum(map(mul, residuals, residuals))
    rho = sum(map(mul, residuals[1:], residuals[:-1])) / energy if energy > 0 else 0.0
    rho = min(max(rho, 0.0), MAX_RHO)
    z_eff = z / math.sqrt((1 + rho) / (1 - rho))
    k = max(4, n // 3)
    recent = theil_sen(xs[-k:], clean[-k:])
    early = theil_sen(xs[:k], clean[:k])
    level = y_mid + slope * (xs[-1] - x_mid) + (ys[-1] - clean[-1])
    return Trend(
        n, xs[-1] - xs[0], slope, recent, early, z_eff, normal_cdf(z_eff), rho, noise, steps.count, level
    )
