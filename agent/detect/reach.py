"""Whether growth reaches the limit: a test against every curve that would stay below it.

A critical finding (the only kind remediation restarts for) states that the memory reaches its
limit within the horizon. That is tested, not assumed: the null hypothesis is the family of
curves that rise by less than the room left (`rise`) within `within` — lines too slow to get
there, and concave curves that level off first, `a + c·(1 - exp(-x/τ))` (a cache filling to its
TTL, a warm-up) and `a + c·log(1 + x/τ)` (fragmentation), for a grid of τ from a tenth of the
span to four spans — and the alternative is any curve of the same family. For each shape the
fit is linear in `a` and `c`, and the best fit under the constraint `c·Δg ≤ rise` (Δg: what the
shape still rises over `within`) costs `(ĉ - c₀)²·S` more squared residuals than the free fit
(S: the shape's spread once the other columns are fitted), so the whole test is in closed form.

The statistic is the constrained fit's extra squared residuals over the best free fit, in noise
variances, the noise inflated by the residuals' lag-one autocorrelation `(1+ρ)/(1-ρ)` (a memory
floor wanders: buckets are not independent). With the true curve on the null family's
bound, its square root is about Student's t with n - k degrees (one constraint on one
coefficient, one-sided; the noise estimated from the same buckets), so the t tail bounds the
chance that a curve that stays below the limit is called a reach (`FALSE_RATE` per judgement). Buckets far off the best fit (a burst that filled
a bucket) are left out first, as `saturation.levelling` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from operator import mul

from agent.detect.saturation import MAX_OUTLIERS, MIN_POINTS, OUTLIER_SIGMAS, TAUS, least_squares
from agent.detect.trend import MAX_RHO, median, normal_cdf

FALSE_RATE = 1e-4  # the chance per judgement that growth levelling below the limit is called a reach
LOG_TAUS = (0.1, 0.25, 0.6, 1.6, 4.0)  # the log shapes' scales, in spans of the fit
HINGES = (0.125, 0.25, 0.375, 0.5, 0.625)  # where a leak may begin within the fit, in spans
GOLDEN_STEPS = 12  # a golden-section search narrows τ between two grid points to 0.3 % of their gap


@dataclass(frozen=True, slots=True)
class Reach:
    """The test's outcome: how strongly the curves that stay below the limit are rejected."""

    stat: float  # the constrained fit's extra squared residuals, in (autocorrelated) noise variances
    rho: float  # lag-one autocorrelation of the best fit's residuals
    points: int  # buckets used (after leaving bursts out)
    dof: int  # the residuals' degrees of freedom the noise is estimated with
    shape: str  # the closest curve that stays below the limit ("line", "exp 0.6", "log 1.6": τ in spans)

    @property
    def p_value(self) -> float:
        """Upper bound on the chance of a statistic this large from a curve that stays below: the
        one-sided tail of Student's t with `dof` degrees at √stat (the bound is one constraint on
        one coefficient; the noise is estimated from the same few buckets, so with 8 of them what
        looks like 4 sigmas is not), by Fisher's normal approximation of t."""
        if math.isinf(self.stat):
            return 0.0
        if self.dof <= 0:
            return 1.0
        t = math.sqrt(self.stat)
        z = t * (1 - 1 / (4 * self.dof)) / math.sqrt(1 + self.stat / (2 * self.dof))
        return normal_cdf(-z)

    @property
    def reaches(self) -> bool:
        return self.p_value <= FALSE_RATE


def reach_test(
    xs: list[float], ys: list[float], rise: float, within: float, extra: list[list[float]] | None = None
) -> Reach | None:
    """Test that the curve through (`xs` seconds, `ys`) rises by `rise` or more within `within`
    seconds after the last point; None with too few points to tell (fewer than `MIN_POINTS`).
    `extra` are columns fitted with every shape (a daily sine and cosine)."""
    n = len(xs)
    if n < MIN_POINTS or xs[-1] <= xs[0] or within <= 0:
        return None
    if rise <= 0:
        return Reach(math.inf, 0.0, n, 1, "none")  # already at the limit
    rel = tuple(x - xs[0] for x in xs)
    keep = list(range(n))
    fitted = _fits(rel, ys, extra, keep, rise, within)
    if fitted is None:
        return None
    residuals = fitted[2]
    spread = 1.4826 * median([abs(r) for r in residuals])
    kept = [i for i, r in zip(keep, residuals, strict=True) if abs(r) <= OUTLIER_SIGMAS * spread]
    if n - len(kept) <= MAX_OUTLIERS * n and len(kept) >= MIN_POINTS and len(kept) < n:
        again = _fits(rel, ys, extra, kept, rise, within)
        if again is not None:
            fitted, keep = again, kept
    free, bound, residuals, shape = fitted
    dof = len(keep) - 3 - len(extra or [])
    if dof <= 0:
        return None
    noise = free / dof
    rho = _lag_one(residuals)
    inflation = (1 + rho) / (1 - rho)
    if noise <= 0:
        return Reach(math.inf if bound > free else 0.0, rho, len(keep), dof, shape)
    return Reach(max(0.0, bound - free) / (noise * inflation), rho, len(keep), dof, shape)


def _fits(
    rel: tuple[float, ...],
    ys: list[float],
    extra: list[list[float]] | None,
    keep: list[int],
    rise: float,
    within: float,
) -> tuple[float, float, list[float], str] | None:
    """(the best free fit's squared residuals, the best constrained fit's, the free fit's
    residuals, the name of the constrained fit's shape) over the line and the curves. The grid
    finds each family's best τ for either fit, and a golden-section search between its
    neighbours refines it: a curve between two grid points misfits far beyond a quiet noise."""
    kept_x = tuple(rel[i] for i in keep)
    kept_y = [ys[i] for i in keep]
    centre = sum(kept_y) / len(kept_y)
    dev = [y - centre for y in kept_y]
    total = sum(map(mul, dev, dev))
    others = [_centred([col[i] for i in keep]) for col in extra or []]
    gain = _others_rss_gain(others, dev)
    span = rel[-1]

    def score(values: tuple[float, ...], delta: float) -> tuple[float, float, float, list[float]] | None:
        """(free squared residuals, constrained, ĉ, the partialled shape) of one shape."""
        spread_col, slope_num = _partial(values, others, dev)
        if spread_col is None:
            return None
        s_xx, col = spread_col
        c_hat = slope_num / s_xx
        rss = total - c_hat * slope_num - gain
        limit_c = rise / delta if delta > 0 else math.inf
        return rss, (rss + (c_hat - limit_c) ** 2 * s_xx if c_hat > limit_c else rss), c_hat, col

    free: tuple[float, float, list[float]] | None = None  # (rss, ĉ, column)
    bound: tuple[float, str] | None = None
    grid: dict[str, list[tuple[float, float, float]]] = {}  # family -> (factor, rss, bound)
    for family, factor, values, delta in _shapes(kept_x, span, within):
        got = score(values, delta)
        if got is None:
            continue
        if free is None or got[0] < free[0]:
            free = (got[0], got[2], got[3])
        if bound is None or got[1] < bound[0]:
            bound = (got[1], _name(family, factor))
        if family != "line":
            grid.setdefault(family, []).append((factor, got[0], got[1]))
    if free is None or bound is None:
        return None
    for family, points in grid.items():
        for which in (1, 2):  # refine the free fit's τ, then the constrained fit's
            at = min(range(len(points)), key=lambda i: points[i][which])
            lo = points[max(at - 1, 0)][0]
            hi = points[min(at + 1, len(points) - 1)][0]
            if hi <= lo:
                continue
            factor, got = _golden(
                lambda f, family=family: score(*_shape(family, f, kept_x, span, within)), lo, hi, which - 1
            )
            if got is None:
                continue
            if got[0] < free[0]:
                free = (got[0], got[2], got[3])
            if got[1] < bound[0]:
                bound = (got[1], _name(family, factor))
    rss, c_hat, col = free
    return rss, bound[0], _residuals(dev, others, col, c_hat), bound[1]


def _golden(
    fn: Callable[[float], tuple[float, float, float, list[float]] | None], lo: float, hi: float, which: int
) -> tuple[float, tuple[float, float, float, list[float]] | None]:
    """The factor in [lo, hi] (searched in logarithms) that minimises `fn(f)[which]`, and `fn` there."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = math.log(lo), math.log(hi)

    def value(f: float) -> float:
        got = fn(math.exp(f))
        return got[which] if got is not None else math.inf

    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = value(c), value(d)
    for _ in range(GOLDEN_STEPS):
        if fc <= fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = value(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = value(d)
    best = math.exp(c if fc <= fd else d)
    return best, fn(best)


def _name(family: str, factor: float) -> str:
    return "line" if family == "line" else f"{family} {factor:.2g}"


def _partial(
    values: tuple[float, ...], others: list[list[float]], dev: list[float]
) -> tuple[tuple[float, list[float]] | None, float]:
    """The shape with the constant and the other columns fitted out of it: ((its sum of squares,
    the partialled column), its product with `dev`); (None, 0) when nothing of it is left."""
    col = _centred(list(values))
    if others:
        coef = least_squares(others, col)
        if coef is not None:
            for c, other in zip(coef, others, strict=True):
                col = [v - c * o for v, o in zip(col, other, strict=True)]
    s_xx = sum(map(mul, col, col))
    if s_xx <= 1e-12 * max(1.0, sum(v * v for v in values)):
        return None, 0.0
    return (s_xx, col), sum(map(mul, col, dev))


def _others_rss_gain(others: list[list[float]], dev: list[float]) -> float:
    """What the other columns alone explain of `dev` (the shape's partialled column adds the rest)."""
    if not others:
        return 0.0
    coef = least_squares(others, dev)
    if coef is None:
        return 0.0
    return sum(c * sum(map(mul, col, dev)) for c, col in zip(coef, others, strict=True))


def _residuals(
    dev: list[float], others: list[list[float]], resid_col: list[float], c_hat: float
) -> list[float]:
    """`dev` less what the other columns and the partialled shape explain."""
    out = list(dev)
    if others:
        coef = least_squares(others, dev)
        if coef is not None:
            for c, other in zip(coef, others, strict=True):
                out = [v - c * o for v, o in zip(out, other, strict=True)]
    return [v - c_hat * r for v, r in zip(out, resid_col, strict=True)]


@lru_cache(maxsize=512)
def _shapes(
    rel: tuple[float, ...], span: float, within: float
) -> list[tuple[str, float, tuple[float, ...], float]]:
    """(family, τ in spans, the shape at `rel`, what it still rises over `within` after `span`) for
    the line, the levelling exponentials and the logs of the grid. Bucket offsets repeat from tick
    to tick."""
    out: list[tuple[str, float, tuple[float, ...], float]] = [("line", math.inf, rel, within)]
    for family, factors in (("exp", TAUS), ("log", LOG_TAUS), ("hinge", HINGES)):
        for factor in factors:
            out.append((family, factor, *_shape(family, factor, rel, span, within)))
    return out


def _shape(
    family: str, factor: float, rel: tuple[float, ...], span: float, within: float
) -> tuple[tuple[float, ...], float]:
    """One curve of `family` with τ = `factor` spans (a hinge's bend there): its values at `rel`, and what it still rises
    over `within` after `span` (per unit of its coefficient)."""
    tau = factor * span
    if family == "hinge":  # flat, then a line from `factor` spans on
        return tuple(max(0.0, x - tau) for x in rel), within
    if family == "exp":
        return (
            tuple(-math.exp(-x / tau) for x in rel),
            math.exp(-span / tau) - math.exp(-(span + within) / tau),
        )
    return tuple(math.log1p(x / tau) for x in rel), math.log((tau + span + within) / (tau + span))


def _centred(values: list[float]) -> list[float]:
    mean = sum(values) / len(values)
    return [v - mean for v in values]


def _lag_one(residuals: list[float]) -> float:
    """Lag-one autocorrelation of the residuals, between 0 and `MAX_RHO`, with the estimate's
    bias on a short series corrected ((1 + 4ρ)/n, Marriott and Pope): 24 buckets of a wandering
    floor read a ρ well below the true one."""
    energy = sum(map(mul, residuals, residuals))
    if energy <= 0:
        return 0.0
    rho = sum(map(mul, residuals[1:], residuals[:-1])) / energy
    rho += (1 + 4 * rho) / len(residuals)
    return min(max(rho, 0.0), MAX_RHO)
