"""The statistics of a comparison, in pure Python (numpy is not one of medic's dependencies).

- `block_bootstrap`: the distribution of a statistic of both builds under resampling of *time
  blocks* of the run, the same blocks for both builds. Requests close in time share the
  machine's noise (another job on the CPU, a frequency change), so resampling single requests
  would understate the uncertainty; resampling whole blocks, paired, keeps that structure.
- `quantile`: linear interpolation between order statistics (numpy's default).
- `binomial_tail`: the exact one-sided test that the candidate's errors exceed the baseline's,
  conditional on their total.
- `theil_sen`: a robust slope, for growth rates shown next to the detector's verdict.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

Blocks = list[list[float]]


def quantile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile of sorted values (NaN for none)."""
    n = len(ordered)
    if n == 0:
        return math.nan
    pos = q * (n - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, n - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def blocks_by_time(times: Sequence[float], values: Sequence[float], edges: Sequence[float]) -> Blocks:
    """`values` split into the time blocks `edges[i] <= t < edges[i + 1]`."""
    out: Blocks = [[] for _ in range(max(0, len(edges) - 1))]
    for t, v in zip(times, values, strict=True):
        i = bisect_right(edges, t) - 1
        if 0 <= i < len(out):
            out[i].append(v)
        elif out and t >= edges[-1]:
            out[-1].append(v)
    return out


def time_edges(start: float, end: float, count: int) -> list[float]:
    width = (end - start) / count
    return [start + i * width for i in range(count)] + [end]


@dataclass(frozen=True, slots=True)
class Comparison:
    """A statistic of the candidate relative to the baseline, with its bootstrap distribution."""

    baseline: float
    candidate: float
    ratio: float  # candidate / baseline
    low: float  # one-sided lower bound of the ratio at the confidence asked
    high: float  # one-sided upper bound
    above_one: float  # share of resamples in which the candidate is worse (ratio > 1)
    above_threshold: float  # share of resamples in which it is worse by more than the threshold

    def to_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.__slots__}


def _ratio(c: float, b: float) -> float:
    if b > 0:
        return c / b
    return 1.0 if c <= 0 else math.inf


def compare(
    base_blocks: Blocks,
    cand_blocks: Blocks,
    statistic: Callable[[list[list[float]]], float],
    *,
    threshold: float,
    confidence: float,
    resamples: int,
    seed: int,
) -> Comparison:
    """`statistic` of each build over all blocks, and its ratio's bootstrap interval over paired blocks.

    `statistic` takes the list of blocks chosen (with repeats) and returns one number.
    """
    pairs = [i for i in range(len(base_blocks)) if base_blocks[i] and cand_blocks[i]]
    b_all = statistic([base_blocks[i] for i in pairs])
    c_all = statistic([cand_blocks[i] for i in pairs])
    ratio = _ratio(c_all, b_all)
    if len(pairs) < 2 or resamples < 1:
        return Comparison(b_all, c_all, ratio, ratio, ratio, 0.5, 0.5)
    rng = random.Random(seed)
    ratios = []
    for _ in range(resamples):
        chosen = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        ratios.append(
            _ratio(statistic([cand_blocks[i] for i in chosen]), statistic([base_blocks[i] for i in chosen]))
        )
    ratios.sort()
    low, high = quantile(ratios, 1 - confidence), quantile(ratios, confidence)  # one-sided bounds
    above_one = sum(1 for r in ratios if r > 1) / len(ratios)
    above = sum(1 for r in ratios if r > 1 + threshold) / len(ratios)
    return Comparison(b_all, c_all, ratio, low, high, above_one, above)


def quantile_of_blocks(q: float) -> Callable[[list[list[float]]], float]:
    def statistic(blocks: list[list[float]]) -> float:
        values = sorted(v for block in blocks for v in block)
        return quantile(values, q)

    return statistic


def ratio_of_sums(blocks: list[list[float]]) -> float:
    """Each block holds (numerator, denominator) flattened: sum of the first over the second."""
    top = sum(block[0] for block in blocks)
    bottom = sum(block[1] for block in blocks)
    return top / bottom if bottom > 0 else math.nan


def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p), exactly (in log space, so large n do not overflow)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0:
        return 0.0
    if p >= 1:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(k, n + 1):
        total += math.exp(
            math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
        )
    return min(1.0, total)


def more_errors_p(base_errors: int, base_total: int, cand_errors: int, cand_total: int) -> float:
    """One-sided p-value that the candidate fails more often: given the errors of both, how likely
    the candidate got at least its share if both failed at the same rate."""
    errors = base_errors + cand_errors
    total = base_total + cand_total
    if errors == 0 or total == 0:
        return 1.0
    return binomial_tail(cand_errors, errors, cand_total / total)


def theil_sen(points: Sequence[tuple[float, float]]) -> float:
    """Median of the pairwise slopes (units of y per unit of x); 0 for fewer than two points."""
    slopes = []
    n = len(points)
    for i in range(n):
        xi, yi = points[i]
        for j in range(i + 1, n):
            xj, yj = points[j]
            if xj != xi:
                slopes.append((yj - yi) / (xj - xi))
    if not slopes:
        return 0.0
    slopes.sort()
    return quantile(slopes, 0.5)


def lower_envelope(
    points: Sequence[tuple[float, float]], start: float, end: float, buckets: int
) -> list[tuple[float, float]]:
    """The minimum of each of `buckets` equal spans of [start, end]: the floor a leak lifts."""
    if end <= start or buckets < 1:
        return []
    width = (end - start) / buckets
    lows: dict[int, float] = {}
    for t, v in points:
        i = min(buckets - 1, int((t - start) // width)) if t >= start else -1
        if i >= 0 and (i not in lows or v < lows[i]):
            lows[i] = v
    return [(start + (i + 0.5) * width, lows[i]) for i in sorted(lows)]
