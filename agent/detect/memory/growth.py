"""Growth of one memory series at one tick, on several time scales, and what it projects.

The `window` scale (24 buckets over `window`) sees hours; the `half-day` scale (24 buckets over
twice that) and the `long` scale (24 buckets over `long_window`, and its trailing half) catch
leaks that hide in noise over a few hours; the `daily` scale compares each half hour with the
same half hour a day before. All fit the lower envelope of the current process lifetime after
its warm-up, with the daily profile removed once it is known. Each step is computed only when a judgement needs it: most
windows of a healthy process are settled by the cheap "has it risen at all" test.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from functools import lru_cache
from itertools import repeat
from operator import add, mul, sub
from typing import cast

from agent.detect.memory.fit import Fit
from agent.detect.memory.prepared import Prepared
from agent.detect.memory.saturation import least_squares
from agent.detect.params import DetectParams
from agent.detect.trend import (
    MAX_RHO,
    STEP_HOLD,
    STEP_SIGMAS,
    Steps,
    Trend,
    mann_kendall,
    median,
    normal_cdf,
    remove_steps,
)

REQUESTS = ("requests_total",)  # a request counter: memory that follows it is traffic, not a leak
STEP_FLOOR = 0.02  # a level shift must exceed 2 % of the level to be removed as a step
PEAK_BUCKETS = 4  # the peak is the median of the last few bucket maxima (ignores one burst)


LONG_SPANS = (1 / 2, 1.0)  # the long scale also fits the trailing half of its window,
# so growth that began inside the window is judged on the span where it runs


def fits(prep: Prepared, metric: str, life: int, tick: float) -> list[Fit]:
    """The fits of `metric` at `tick`: the window scale, then the long scale's spans that have
    enough buckets and see more than the window scale."""
    params = prep.params
    window = _fit(prep, metric, life, tick, "window", 1.0)
    if window is None:
        return []
    half = _fit(prep, metric, life, tick, "half-day", 1.0)
    # the long scale changes only when one of its buckets completes (or the day's profile): cache it
    key = (metric, life, math.floor(tick / params.long_bucket + 1e-9), math.floor(tick / params.season))
    long = cast("list[Fit] | None", prep.cache.get(key))  # the cache holds each key's own kind
    if long is None:
        long = []
        for part in LONG_SPANS:
            fit = _fit(prep, metric, life, tick, "long", part)
            if fit is not None and (not long or fit.idx[0] != long[-1].idx[0]):
                long.append(fit)
        daily = _daily_fit(prep, metric, life, tick)
        if daily is not None:
            long.append(daily)
        cycle = _cycle_fit(prep, metric, life, tick) if half is not None and not half.profile_known else None
        if cycle is not None:
            long.append(cycle)
        prep.cache[key] = long
    return [window, *([half] if half is not None else []), *long]


def _fit(prep: Prepared, metric: str, life: int, tick: float, scale: str, part: float) -> Fit | None:
    params = prep.params
    if scale == "window":
        env, span = prep.base(metric), params.window
    elif scale == "half-day":
        env, span = prep.stepped(metric), 2 * params.window
    else:
        env, span = prep.long(metric), params.long_window * part
    width = env.width
    end = math.floor(tick / width + 1e-9)
    first = max(warm_bucket(prep, life, width), end - round(span / width))
    idx, lo = env.floors(life, first, end)
    if len(idx) < params.min_buckets:
        return None
    if scale != "window" and (idx[-1] - idx[0] + 1) * width <= params.window:
        return None  # the wider scales add nothing until they see more than the window scale
    profile = prep.profile(metric, tick, env, life)
    seasonal = profile is not None and profile.amplitude > 0
    offset = 0.0
    ys = lo
    if profile is not None and seasonal:
        table = profile.values
        size = len(table)
        n, start = len(idx), idx[0] % size
        removed: Sequence[float]  # the profile under each bucket of the fit
        if idx[-1] - idx[0] != n - 1:
            removed = [table[b % size] for b in idx]
        elif start + n <= size:  # no gap: the profile's values from `start` on, wrapping round
            removed = table[start : start + n]
        else:
            removed = (table * (n // size + 2))[start : start + n]
        offset = table[idx[-1] % size]
        if profile.relative:  # a workload's prior: fractions of this fit's own level
            level = median(lo)
            removed = list(map(mul, removed, repeat(level, n)))
            offset = offset * level
        ys = list(map(sub, lo, removed))
    fit = Fit(metric, scale, width, idx, ys, offset, seasonal, profile is not None, STEP_FLOOR * abs(lo[-1]))
    fit.floors = lo
    return fit


def warm_bucket(prep: Prepared, life: int, width: float) -> int:
    """The first bucket of `width` after lifetime `life`'s warm-up (the same at every tick)."""
    key = ("warm", life, width)
    found = prep.cache.get(key)
    if found is None:
        found = prep.cache[key] = math.ceil((prep.starts[life] + prep.warmup(life)) / width - 1e-9)
    return found  # type: ignore[return-value]


def _daily_fit(prep: Prepared, metric: str, life: int, tick: float) -> Fit | None:
    """Growth from one day to the next at the same time of day, over the last day.

    The daily cycle cancels exactly in these differences, whatever its shape and without
    learning it; steps are removed first (a reload must not count as a day of growth), and the
    sign test on the differences is corrected for their autocorrelation like Mann-Kendall.
    Needs three periods of the same lifetime: the first one is its warm-up at this scale (a
    working set that ratchets up with the first day's traffic peak, or a cache filling). Works
    on buckets of `params.step` (48 a day at the defaults).
    """
    params = prep.params
    env = prep.stepped(metric)
    width = env.width
    count = params.season / width
    period = round(count)
    if abs(count - period) > 1e-6 or period < 8:
        return None
    # judged as of the last long-bucket boundary: the fit is cached per long bucket, and the
    # agent must find the same whichever tick of that bucket it asks at
    boundary = math.floor(tick / params.long_bucket + 1e-9) * params.long_bucket
    end = math.floor(boundary / width + 1e-9)
    if prep.starts[life] + prep.warmup(life) + params.season > (end - 2 * period) * width:
        return None
    idx, lo, _ = env.select(life, end - 2 * period, end)
    if len(idx) < 1.5 * period:
        return None
    floor = STEP_FLOOR * abs(lo[-1])
    steps = remove_steps(lo, floor)
    clean = steps.clean
    if len(idx) == 2 * period:  # no gap: pair each bucket with the one a period before
        diffs = list(map(sub, clean[period:], clean[:period]))
    else:
        by_bucket = dict(zip(idx, clean, strict=True))
        diffs = [
            by_bucket[b] - by_bucket[b - period] for b in idx if b >= end - period and b - period in by_bucket
        ]
    m = len(diffs)
    if m < 0.75 * period:
        return None
    ordered = sorted(diffs)
    centre = median(ordered)
    s = (m - bisect_right(ordered, 0.0)) - bisect_left(ordered, 0.0)
    z = (s - math.copysign(1, s)) / math.sqrt(m) if s else 0.0
    fit = Fit(metric, "daily", width, idx, lo, 0.0, False, True, floor)
    fit._rising, fit._steps, fit._z = centre > 0 and z > 0, steps, z
    # most judgements read only the confidence: the trend is made when one needs it
    fit._make_trend = lambda: _daily_trend(params, idx, width, lo, steps, diffs, centre, z)
    return fit


def _daily_trend(
    params: DetectParams,
    idx: list[int],
    width: float,
    lo: list[float],
    steps: Steps,
    diffs: list[float],
    centre: float,
    z: float,
) -> Trend:
    """The daily fit's trend from its day-over-day differences (sign test z `z`, median `centre`)."""
    m = len(diffs)
    dev = _detrended(diffs)  # a leak that began within the day makes the differences a ramp
    energy = sum(map(mul, dev, dev))
    rho = min(max(sum(map(mul, dev[1:], dev[:-1])) / energy if energy > 0 else 0.0, 0.0), MAX_RHO)
    z_eff = z / math.sqrt((1 + rho) / (1 - rho))
    third = max(1, m // 3)
    return Trend(
        n=m,
        span=(idx[-1] - idx[0]) * width,
        slope=centre / params.season,
        recent_slope=median(diffs[-third:]) / params.season,
        early_slope=median(diffs[:third]) / params.season,
        z=z_eff,
        confidence=normal_cdf(z_eff),
        autocorrelation=rho,
        noise=1.4826 * median(list(map(abs, map(sub, diffs, repeat(centre, m))))) / math.sqrt(2.0),
        steps=steps.count,
        level=median(lo[-4:]),
    )


@lru_cache(maxsize=64)
def _centred_positions(n: int) -> tuple[list[float], float]:
    """Positions 0..n-1 centred on their mean, and the sum of their squares."""
    xs = [i - (n - 1) / 2 for i in range(n)]
    return xs, sum(map(mul, xs, xs))


def _detrended(values: list[float]) -> list[float]:
    """Residuals of `values` around their least-squares line (against their position)."""
    n = len(values)
    xs, sxx = _centred_positions(n)
    y_mean = sum(values) / n
    slope = sum(map(mul, xs, values)) / sxx if sxx else 0.0
    return list(map(sub, map(sub, values, repeat(y_mean, n)), map(mul, repeat(slope, n), xs)))


def at_record(prep: Prepared, metric: str, life: int, tick: float) -> bool:
    """Whether the floor's mean over the last period is above its mean over every earlier whole
    period of the lifetime (after warm-up, at most `season_days` back): true of a leak, and only
    now and then of a process that wanders. True when there is no earlier whole period."""
    params = prep.params
    env = prep.base(metric)
    width = env.width
    per = params.season / width
    end = math.floor(tick / width + 1e-9)
    start = warm_bucket(prep, life, width)
    means = []
    hi: float = end
    oldest = end - params.season_days * per  # no further back than the history the agent keeps
    while hi - per >= max(start, oldest) - 1e-9:
        lo_b = round(hi - per)
        _, lows, _ = env.select(life, lo_b, round(hi))
        if len(lows) >= 0.75 * per:
            means.append(sum(lows) / len(lows))
        hi -= per
    return len(means) < 2 or means[0] > max(means[1:])


def peak(prep: Prepared, metric: str, life: int, tick: float) -> float | None:
    """Where the peaks of `metric` are now: the median of the last bucket maxima."""
    env = prep.base(metric)
    end = math.floor(tick / env.width + 1e-9)
    _, _, hi = env.select(life, end - PEAK_BUCKETS, end)
    if not hi:
        return None
    ordered = sorted(hi)
    return ordered[len(ordered) // 2]


def time_to_limit(limit: float | None, peak_now: float | None, slope: float) -> float | None:
    """Seconds until the peaks reach `limit` at `slope`; 0 when they already do, None if never."""
    if limit is None or peak_now is None:
        return None
    if peak_now >= limit:
        return 0.0
    if slope <= 0:
        return None
    return (limit - peak_now) / slope


def traffic_rates(prep: Prepared, life: int, width: float) -> dict[int, float] | None:
    """Requests per second in each bucket of `width` of lifetime `life`, from the request counter
    (None without one). A bucket in which the counter falls (a reset) has no rate."""
    key = ("traffic", life, width)
    if key in prep.cache:
        return prep.cache[key]  # type: ignore[return-value]
    points = next((prep.series.series.get(name) for name in REQUESTS if prep.series.series.get(name)), None)
    rates: dict[int, float] | None = None
    if points:
        start = prep.starts[life]
        end = prep.starts[life + 1] if life + 1 < len(prep.starts) else math.inf
        i, j = bisect_left(points, (start, -math.inf)), bisect_left(points, (end, -math.inf))
        rates = {}
        k = i
        while k < j:
            b = int(points[k][0] // width)
            m = k
            while m + 1 < j and int(points[m + 1][0] // width) == b:
                m += 1
            (t0, v0), (t1, v1) = points[k], points[m]
            if t1 > t0 and v1 >= v0:
                rates[b] = (v1 - v0) / (t1 - t0)
            k = m + 1
    prep.cache[key] = rates
    return rates


def traffic_explains(prep: Prepared, fit: Fit, life: int, confidence: float) -> bool | None:
    """Whether the fit's growth is the traffic's: its floor regressed on the request rate leaves
    no growth (bytes per request flat) at `confidence`. None without a request counter, or when
    too few buckets have a rate to tell."""
    rates = traffic_rates(prep, life, fit.width)
    if not rates:
        return None
    if fit.scale == "daily":
        return _traffic_explains_days(fit, rates, round(prep.params.season / fit.width), confidence)
    floors = fit.floors if fit.floors is not None else fit.ys  # the rate carries the daily cycle too
    pairs = [(rates[b], y) for b, y in zip(fit.idx, floors, strict=True) if b in rates]
    if len(pairs) < max(4, 0.75 * len(fit.idx)):
        return None
    xs = [x for x, _ in pairs]
    ys = [y for _, y in pairs]
    n = len(xs)
    x_mean, y_mean = sum(xs) / n, sum(ys) / n
    sxx = sum((x - x_mean) ** 2 for x in xs)
    if sxx <= 0:
        return False  # traffic did not change: it explains nothing
    per_request = sum((x - x_mean) * (y - y_mean) for x, y in pairs) / sxx
    if per_request <= 0:
        return False
    residual = [y - per_request * x for x, y in pairs]
    return normal_cdf(mann_kendall(residual)[1]) < confidence


def _traffic_explains_days(fit: Fit, rates: dict[int, float], period: int, confidence: float) -> bool | None:
    """`traffic_explains` for day-over-day differences: the change of the floor against the
    change of the request rate since the same time a day before; a leak is what remains."""
    floors = dict(zip(fit.idx, fit.ys, strict=True))
    pairs = [
        (rates[b] - rates[b - period], floors[b] - floors[b - period])
        for b in fit.idx
        if b - period in floors and b in rates and b - period in rates
    ]
    if len(pairs) < 8:
        return None
    sxx = sum(x * x for x, _ in pairs)
    if sxx <= 0:
        return False
    per_request = sum(x * y for x, y in pairs) / sxx
    if per_request <= 0:
        return False
    residual = [y - per_request * x for x, y in pairs]
    rising = sum(1 for r in residual if r > 0) - sum(1 for r in residual if r < 0)
    return normal_cdf(rising / math.sqrt(len(residual))) < confidence


CYCLE_COVERAGE = 0.75  # the cycle scale needs this fraction of a period after the warm-up...
CYCLE_EARLY = 0.5  # ...or this fraction, when the line grows more than the fitted daily swing
CYCLE_GROWTH = 2.0  # ...than this many times the fitted amplitude (the whole swing, trough to peak)
CYCLE_WARMUP = 4  # ...and skips at least this many `warmup`s after the start


def _cycle_fit(prep: Prepared, metric: str, life: int, tick: float) -> Fit | None:
    """Growth with a daily cycle that has not been learned: a line plus one sine of the period,
    fitted together to the lifetime's floor (30-minute buckets since the warm-up, at most
    `long_window`), then judged on the floor with the fitted sine removed.

    A process with no history and no prior has only hours of a daily cycle to go by: a rise in
    the afternoon is half a sine, a leak is a line under it, and from three quarters of a period
    on the two can be told apart; from half a period on, when the line grows more than the
    fitted swing. The fit is made with level steps removed (a reload is a discontinuity, which
    neither a line nor a sine is). The removed sine is the profile of this fit alone. A sine also
    bends to fit a cache that fills and levels off, so this scale only speaks for growth that
    would reach the limit within the horizon (`leak.assess`)."""
    params = prep.params
    if any(prep.series.series.get(name) for name in REQUESTS):
        return None  # the request rate explains the daily cycle itself (`traffic_explains`)
    env = prep.stepped(metric)
    width = env.width
    # judged as of the last long-bucket boundary, like every fit of the cache it lives in
    end = math.floor(math.floor(tick / params.long_bucket + 1e-9) * params.long_bucket / width + 1e-9)
    warm = max(prep.warmup(life), CYCLE_WARMUP * params.warmup)  # a line is thrown by a warm-up's tail
    first = max(math.ceil((prep.starts[life] + warm) / width - 1e-9), end - round(params.long_window / width))
    idx, lo, _ = env.select(life, first, end)
    if len(idx) < params.min_buckets or (idx[-1] - idx[0] + 1) * width < CYCLE_EARLY * params.season:
        return None
    floor = STEP_FLOOR * abs(lo[-1])
    clean = remove_steps(lo, floor).clean  # a reload is a discontinuity: neither a line nor a sine
    # a jump too close to an end for `remove_steps` to tell a reload from a batch would bend the
    # sine: near the start, fit after it; near the end, wait until it can be told
    if jumped_lately(clean, floor):
        return None
    jump = _level_jump(clean, floor)
    if jump is not None and jump < STEP_HOLD:
        idx, lo, clean = idx[jump:], lo[jump:], clean[jump:]
        if len(idx) < params.min_buckets or (idx[-1] - idx[0] + 1) * width < CYCLE_EARLY * params.season:
            return None
    omega = 2 * math.pi * width / params.season
    centre = (idx[0] + idx[-1]) / 2
    sines = [math.sin(omega * b) for b in idx]
    cosines = [math.cos(omega * b) for b in idx]
    columns = [[1.0] * len(idx), [b - centre for b in idx], sines, cosines]
    coef = least_squares(columns, clean)
    if coef is None:
        return None
    wave = list(map(add, map(mul, repeat(coef[2]), sines), map(mul, repeat(coef[3]), cosines)))
    swing = math.hypot(coef[2], coef[3])
    coverage = (idx[-1] - idx[0] + 1) * width
    if coverage < CYCLE_COVERAGE * params.season and coef[1] * (idx[-1] - idx[0]) <= CYCLE_GROWTH * swing:
        return None  # before three quarters of a period, only growth larger than the fitted swing
    ys = list(map(sub, lo, wave))
    offset = wave[-1]
    fit = Fit(metric, "cycle", width, idx, ys, offset, True, True, floor)
    fit.wave, fit.sine = swing, (coef[2], coef[3])
    fit.floors, fit.basis = clean, [sines, cosines]
    return fit


def early_cycle(fit: Fit, params: DetectParams) -> bool:
    """A cycle fit made before three quarters of a period, on growth larger than its fitted swing."""
    return fit.scale == "cycle" and fit.coverage < CYCLE_COVERAGE * params.season - 1e-6


def jumped_lately(values: list[float], floor: float) -> bool:
    """Whether the largest jump of `values` (`_level_jump`) is too close to their end for
    `remove_steps` to tell a reload from growth yet: until it can, what follows it reads as a rise."""
    jump = _level_jump(values, floor)
    return jump is not None and jump > len(values) - STEP_HOLD


def _level_jump(values: list[float], floor: float) -> int | None:
    """Where the largest change between consecutive buckets lands (the index after it) when it
    is larger than `floor` and than `STEP_SIGMAS` times the typical change: a leak or a daily
    cycle moves the floor a little every bucket, a reload or a batch all at once."""
    if len(values) < 4:
        return None
    diffs = list(map(sub, values[1:], values[:-1]))
    centre = median(diffs)
    offsets = list(map(abs, map(sub, diffs, repeat(centre, len(diffs)))))
    spread = 1.4826 * median(offsets)
    size = max(offsets)
    at = offsets.index(size)  # the first of the largest, as max with a key picks
    return at + 1 if size > floor and size > STEP_SIGMAS * spread else None
