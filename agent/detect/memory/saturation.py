"""Growth that levels off: a cache filling to its TTL, a pool warming up, fragmentation like log(t).

A leak grows without bound; a working set approaches a level. Over a few hours both rise, and
a straight line through either projects the limit. A concave curve `y = A - B·exp(-x/τ)` (B > 0)
fitted beside the line tells them apart: when it explains the step-free floor much better than
the line, and its slope now is a fraction of its mean slope, the growth is levelling off towards
`A`, and what it projects must level too. The fit is linear in `A` and `B` for a given `τ`, so
a short grid of `τ` (from a tenth to four times the span) finds it without iterating. A bucket
that stands far off both (a burst that filled a whole bucket) is left out before judging.

`reach_margin` asks the converse, for a critical severity: not whether a levelling curve fits
better, but whether every curve that stays below the limit for a while fits clearly worse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from operator import mul, sub
from statistics import NormalDist

TAUS = (0.1, 0.15, 0.25, 0.4, 0.6, 1.0, 1.6, 2.5, 4.0)  # time constants, in spans of the fit
MIN_POINTS = 8  # fewer buckets cannot tell a curve from a line
F_MIN = 12.0  # levelled: the curve explains this many noise variances more than the line...
F_POSSIBLE = 3.0  # (saturation is not ruled out from this many on)
GAIN_MIN = 0.5  # ...and leave at most this fraction of the line's squared residuals
RATE_RATIO = 0.5  # ...and grow now at less than this fraction of its mean slope over the fit
OUTLIER_SIGMAS = 4.0  # a bucket this many robust sigmas off the curve is left out (a burst)
MAX_OUTLIERS = 0.2  # ...at most this fraction of them


@dataclass(frozen=True, slots=True)
class Levelling:
    """The rising concave curve that fits the growth best, and how much better than a line."""

    asymptote: float  # A, in the units of the values fitted
    tau: float  # seconds
    now: float  # the curve (without any daily wave fitted with it) at the last point
    rate_now: float  # its slope at the last point, units per second
    mean_rate: float  # its mean slope over the fit
    f: float  # the line's extra squared residuals over the curve's, in noise variances
    gain: float  # the curve's squared residuals over the line's

    @property
    def slowing(self) -> bool:
        """The curve grows now at a fraction of its mean slope: it is levelling off."""
        return self.mean_rate > 0 and self.rate_now < RATE_RATIO * self.mean_rate

    @property
    def levelled(self) -> bool:
        """Strong evidence of growth levelling off: not a leak, and its projection levels too."""
        return self.slowing and self.f >= F_MIN and self.gain <= GAIN_MIN

    @property
    def possible(self) -> bool:
        """Saturation is not ruled out: the curve is levelling and fits better than the line."""
        return self.slowing and self.f >= F_POSSIBLE

    def rise(self, seconds: float) -> float:
        """How much the curve rises in the `seconds` after the last point."""
        return (self.asymptote - self.now) * (1 - math.exp(-seconds / self.tau))

    def time_to(self, level: float) -> float | None:
        """Seconds from the last point until the curve reaches `level` (None: it never does)."""
        if level <= self.now:
            return 0.0
        gap_now = self.asymptote - self.now
        if level >= self.asymptote or gap_now <= 0:
            return None
        return self.tau * math.log(gap_now / (self.asymptote - level))


def levelling(xs: list[float], ys: list[float], extra: list[list[float]] | None = None) -> Levelling | None:
    """The rising concave curve that fits (`xs` seconds, `ys`) best, compared with a straight line;
    None with too few points to tell, or when no rising concave curve fits. `extra` are columns
    fitted with both (a daily sine and cosine)."""
    n = len(xs)
    if n < MIN_POINTS or xs[-1] <= xs[0]:
        return None
    rel = [x - xs[0] for x in xs]
    keep = list(range(n))
    found = _best_curve(rel, ys, extra, keep)
    if found is None:
        return None
    residuals = found[1]
    spread = 1.4826 * _median([abs(r) for r in residuals])
    keep = [i for i, r in zip(keep, residuals, strict=True) if abs(r) <= OUTLIER_SIGMAS * spread]
    if n - len(keep) > MAX_OUTLIERS * n or len(keep) < MIN_POINTS:
        return None
    if len(keep) < n:
        found = _best_curve(rel, ys, extra, keep)
        if found is None:
            return None
    (tau, a, c), residuals = found
    rss = sum(r * r for r in residuals)
    line = _rss(_columns([rel[i] for i in keep], None, extra, keep), [ys[i] for i in keep])
    if line is None or line <= 0:
        return None
    noise = rss / max(len(keep) - 3 - len(extra or []), 1)
    f = (line - rss) / noise if noise > 0 else math.inf
    span = rel[-1]
    now = a + c * math.exp(-span / tau)
    rate_now = -c / tau * math.exp(-span / tau)
    return Levelling(a, tau, now, rate_now, (now - a - c) / span, f, rss / line)


def _columns(
    rel: list[float], tau: float | None, extra: list[list[float]] | None, keep: list[int]
) -> list[list[float]]:
    """A constant, the curve's `exp(-x/τ)` (a line's x when `tau` is None), and the extra columns."""
    shape = [math.exp(-x / tau) for x in rel] if tau is not None else rel
    return [[1.0] * len(keep), shape if tau is None else [shape[i] for i in keep]] + [
        [col[i] for i in keep] for col in extra or []
    ]


def _best_curve(
    rel: list[float], ys: list[float], extra: list[list[float]] | None, keep: list[int]
) -> tuple[tuple[float, float, float], list[float]] | None:
    """((τ, A, C), residuals) of the rising concave curve `A + C·exp(-x/τ)` (C < 0) that fits
    the points `keep` best, over the grid of τ; None when none rises. Each τ's squared residuals
    come from the normal equations (centred values: yᵀy - coefᵀXᵀy); only the best's are listed."""
    span = rel[-1]
    kept = [ys[i] for i in keep]
    centre = sum(kept) / len(kept)
    dev = [y - centre for y in kept]
    total = sum(map(mul, dev, dev))
    best = None
    for tau, shape, centred, sxx in _shapes(span, tuple(rel[i] for i in keep)):
        if extra:
            columns = [[1.0] * len(keep), list(shape)] + [[col[i] for i in keep] for col in extra]
            coef = least_squares(columns, dev)
            if coef is None or coef[1] >= 0:
                continue  # falling towards its level, or convex: not a working set filling up
            rss = total - sum(c * sum(map(mul, col, dev)) for c, col in zip(coef, columns, strict=True))
        else:  # a constant and one shape: the shape's slope in closed form (`dev` sums to 0)
            sxy = sum(map(mul, centred, dev))
            if sxx <= 0 or sxy >= 0:
                continue
            slope = sxy / sxx
            coef, rss = [-slope * (shape[0] - centred[0]), slope], total - slope * sxy
        if best is None or rss < best[0]:
            best = (rss, tau, coef, shape)
    if best is None:
        return None
    _, tau, coef, shape = best
    fitted = [coef[0] + coef[1] * x for x in shape]
    for c, col in zip(coef[2:], extra or [], strict=True):
        fitted = [f + c * col[i] for f, i in zip(fitted, keep, strict=True)]
    return (tau, coef[0] + centre, coef[1]), list(map(sub, dev, fitted))


@lru_cache(maxsize=512)
def _shapes(span: float, rel: tuple[float, ...]) -> list[tuple[float, tuple[float, ...], list[float], float]]:
    """For each τ of the grid: (τ, `exp(-x/τ)` at `rel`, the same centred, its sum of squares; 0
    when it is (nearly) constant). The offsets of a scale's buckets repeat from tick to tick."""
    out = []
    for factor in TAUS:
        tau = factor * span
        shape = tuple(math.exp(-x / tau) for x in rel)
        mean = sum(shape) / len(shape)
        centred = [x - mean for x in shape]
        sxx = sum(map(mul, centred, centred))
        out.append((tau, shape, centred, sxx if sxx > 1e-12 * max(1.0, sum(map(mul, shape, shape))) else 0.0))
    return out


def _simple(xs: list[float], dev: list[float]) -> list[float] | None:
    """[intercept, slope] of `dev` (centred: it sums to 0) on one column `xs`; None when `xs` is
    (nearly) constant."""
    mean = sum(xs) / len(xs)
    centred = [x - mean for x in xs]
    sxx = sum(map(mul, centred, centred))
    if sxx <= 1e-12 * max(1.0, sum(map(mul, xs, xs))):
        return None
    slope = sum(map(mul, centred, dev)) / sxx
    return [-slope * mean, slope]


def _rss(columns: list[list[float]], ys: list[float]) -> float | None:
    centre = sum(ys) / len(ys)
    dev = [y - centre for y in ys]
    coef = _simple(columns[1], dev) if len(columns) == 2 else least_squares(columns, dev)
    if coef is None:
        return None
    total: float = sum(map(mul, dev, dev))
    explained: float = sum(c * sum(map(mul, col, dev)) for c, col in zip(coef, columns, strict=True))
    return total - explained


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def least_squares(columns: list[list[float]], ys: list[float]) -> list[float] | None:
    """Ordinary least squares by the normal equations (a few columns: Gaussian elimination with
    partial pivoting); None when the columns are (nearly) dependent."""
    k = len(columns)
    a = [[0.0] * k + [sum(map(mul, columns[i], ys))] for i in range(k)]
    for i in range(k):
        for j in range(i, k):  # the products commute exactly: the matrix is symmetric
            a[i][j] = a[j][i] = sum(map(mul, columns[i], columns[j]))
    for col in range(k):
        pivot = max(range(col, k), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-9 * max(1.0, abs(a[col][col])):
            return None
        a[col], a[pivot] = a[pivot], a[col]
        for r in range(k):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col], strict=True)]
    return [a[i][k] / a[i][i] for i in range(k)]


REACH_TAUS = (*TAUS, 10.0, 25.0)  # ...the slow end: near-lines whose slope is bounded by the room


def reach_bar(confidence: float) -> float:
    """The margin `reach_margin` must clear to reject every curve that stays below the limit at
    `confidence` (one-sided: the squared normal quantile, 9.5 noise variances at 0.999)."""
    return NormalDist().inv_cdf(confidence) ** 2


def reach_margin(
    xs: list[float], ys: list[float], room: float, within: float, extra: list[list[float]] | None = None
) -> float:
    """How many noise variances (`ys` seconds `xs`) every curve that rises less than `room` over the
    next `within` seconds fits worse than the best free fit (a line or any curve of the grid): the
    evidence that the growth reaches the limit, not a working set levelling off below it. Each curve
    `A + C·exp(-x/τ)` is concave or flat (C ≤ 0), its C bounded by the room; a line's slope
    likewise. Buckets far off the free fit (a burst that filled one) are left out first."""
    n = len(xs)
    if n < MIN_POINTS or xs[-1] <= xs[0] or room <= 0 or within <= 0:
        return 0.0
    rel = [x - xs[0] for x in xs]
    keep = list(range(n))
    for _ in range(2):  # the second pass without the outliers of the first
        tried = _reach_fits(rel, ys, extra, keep, room, within)
        if tried is None:
            return 0.0
        free, bounded, residuals = tried
        spread = 1.4826 * _median([abs(r) for r in residuals])
        kept = [i for i, r in zip(keep, residuals, strict=True) if abs(r) <= OUTLIER_SIGMAS * spread]
        if len(kept) == len(keep) or n - len(kept) > MAX_OUTLIERS * n or len(kept) < MIN_POINTS:
            break
        keep = kept
    noise = free / max(len(keep) - 3 - len(extra or []), 1)
    return (bounded - free) / noise if noise > 0 else math.inf


def _reach_fits(
    rel: list[float],
    ys: list[float],
    extra: list[list[float]] | None,
    keep: list[int],
    room: float,
    within: float,
) -> tuple[float, float, list[float]] | None:
    """(the best free fit's squared residuals, those of the best curve bounded by the room, the
    free fit's residuals) over the points `keep`. For one shape column the squared residuals are
    a parabola in its coefficient (Frisch-Waugh: the shape and `ys` net of the other columns), so
    each bound is a clamp."""
    span = rel[-1]
    base = [[1.0] * len(keep)] + [[col[i] for i in keep] for col in extra or []]
    kept = [ys[i] for i in keep]
    y_net = _net(base, kept)
    if y_net is None:
        return None
    rss_base = sum(map(mul, y_net, y_net))
    xs_kept = [rel[i] for i in keep]
    shapes: list[tuple[list[float], float, float]] = [(xs_kept, -math.inf, room / within)]  # the line
    for factor in REACH_TAUS:
        tau = factor * span
        rise = math.exp(-span / tau) * (1 - math.exp(-within / tau))  # per unit of -C, over `within`
        shapes.append(([math.exp(-x / tau) for x in xs_kept], -room / rise, 0.0))
    free = bounded = math.inf
    best: list[float] | None = None
    for shape, low, high in shapes:
        s_net = _net(base, shape)
        if s_net is None:
            continue
        q = sum(map(mul, s_net, s_net))
        if q <= 1e-12 * max(1.0, sum(map(mul, shape, shape))):
            continue
        coef = sum(map(mul, s_net, y_net)) / q
        rss = rss_base - coef * coef * q
        if rss < free:
            free, best = rss, [y - coef * s for y, s in zip(y_net, s_net, strict=True)]
        clamped = min(max(coef, low), high)
        bounded = min(bounded, rss + q * (clamped - coef) ** 2)
    if best is None:
        return None
    return max(free, 0.0), max(bounded, 0.0), best


def _net(columns: list[list[float]], values: list[float]) -> list[float] | None:
    """`values` less their least-squares fit on `columns` (None when the columns are dependent)."""
    if len(columns) == 1:
        centre = sum(values) / len(values)
        return [v - centre for v in values]
    coef = least_squares(columns, values)
    if coef is None:
        return None
    fitted = [sum(c * col[i] for c, col in zip(coef, columns, strict=True)) for i in range(len(values))]
    return list(map(sub, values, fitted))
