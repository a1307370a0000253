"""Robust trend of a short sequence (a lower envelope): is it growing steadily, and how fast?

Why each step:
- level shifts (a model reload, a long batch) are removed first: a few isolated jumps that
  stand far out of the typical bucket-to-bucket change are subtracted, so a step that then
  stays flat is not growth. Many jumps in one window are a staircase leak and are kept.
- the slope is Theil-Sen (median of pairwise slopes), the significance Mann-Kendall's S
  computed from the same sorted slopes: both ignore a few odd buckets.
- growth that decelerates (warm-up filling a cache, working set reaching its plateau) shows a
  recent slope far below the window's slope.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass

STEP_SIGMAS = 6.0  # a bucket-to-bucket change this many robust sigmas off the typical one is a step
MAX_STEPS = 2  # more jumps than this in one window are growth, not reloads


@dataclass(frozen=True, slots=True)
class Trend:
    n: int
    span: float  # seconds between the first and the last point
    slope: float  # units per second, after removing steps
    recent_slope: float  # slope of the most recent third of the points
    z: float  # Mann-Kendall z (one-sided: large and positive means growing)
    confidence: float  # Phi(z)
    noise: float  # robust scale of the residuals around the fitted line
    steps: int  # level shifts removed
    level: float  # fitted value at the last point (step-corrected, in the original units)

    @property
    def decel(self) -> float:
        """Recent slope over window slope (1 for steady growth, near 0 for a plateau)."""
        if self.slope <= 0:
            return 0.0
        return self.recent_slope / self.slope


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


def remove_steps(ys: list[float], floor: float) -> tuple[list[float], int]:
    """`ys` with isolated level shifts subtracted, and how many were removed.

    A change counts as a shift when it is farther than `STEP_SIGMAS` robust sigmas and `floor`
    from the median change; if more than `MAX_STEPS` do, the series is left as it is.
    """
    n = len(ys)
    if n < 4:
        return ys, 0
    diffs = [ys[i + 1] - ys[i] for i in range(n - 1)]
    typical = median(diffs)
    spread = 1.4826 * median([abs(d - typical) for d in diffs])
    limit = max(STEP_SIGMAS * spread, floor)
    jumps = [i for i, d in enumerate(diffs) if abs(d - typical) > limit]
    if not jumps or len(jumps) > MAX_STEPS:
        return ys, 0
    out = list(ys)
    shift = 0.0
    jump_set = set(jumps)
    for i in range(n - 1):
        if i in jump_set:
            shift += diffs[i] - typical
        out[i + 1] = ys[i + 1] - shift
    return out, len(jumps)


def _pair_slopes(xs: list[float], ys: list[float]) -> list[float]:
    slopes: list[float] = []
    n = len(xs)
    for i in range(n - 1):
        xi, yi = xs[i], ys[i]
        slopes.extend([(y - yi) / (x - xi) for x, y in zip(xs[i + 1 :], ys[i + 1 :])])
    slopes.sort()
    return slopes


def theil_sen(xs: list[float], ys: list[float]) -> float:
    slopes = _pair_slopes(xs, ys)
    return median(slopes) if slopes else 0.0


def trend(xs: list[float], ys: list[float], step_floor: float) -> Trend:
    """The robust trend of `ys` at times `xs` (sorted, at least 4 points)."""
    n = len(xs)
    clean, steps = remove_steps(ys, step_floor)
    slopes = _pair_slopes(xs, clean)
    m = len(slopes)
    mid = m // 2
    slope = slopes[mid] if m % 2 else 0.5 * (slopes[mid - 1] + slopes[mid])
    # Mann-Kendall S: the sign of each pair's slope is the sign of its difference
    s = (m - bisect_right(slopes, 0.0)) - bisect_left(slopes, 0.0)
    var = n * (n - 1) * (2 * n + 5) / 18.0
    z = (s - math.copysign(1, s)) / math.sqrt(var) if s else 0.0
    x_mid, y_mid = median(xs), median(clean)
    residuals = [y - (y_mid + slope * (x - x_mid)) for x, y in zip(xs, clean)]
    noise = 1.4826 * median([abs(r) for r in residuals])
    k = max(4, n // 3)
    recent = theil_sen(xs[-k:], clean[-k:])
    level = y_mid + slope * (xs[-1] - x_mid) + (ys[-1] - clean[-1])
    return Trend(n, xs[-1] - xs[0], slope, recent, z, normal_cdf(z), noise, steps, level)
