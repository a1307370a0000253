"""One scale's view of one memory series at one tick (`Fit`): its step-free lower envelope, and what
is worked out from it only when a judgement asks (the rise, the trend, the curve it levels off along).

`agent.detect.memory.growth` makes the fits of each scale; the detectors judge them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.detect.memory.saturation import MIN_POINTS, Levelling, levelling, reach_margin
from agent.detect.params import DetectParams
from agent.detect.trend import (
    Steps,
    Trend,
    mann_kendall,
    might_rise,
    normal_cdf,
    remove_steps,
    thirds_rise,
    trend,
)


@dataclass(slots=True)
class Fit:
    """One scale's view of one series at one tick."""

    metric: str
    scale: str  # "window" | "half-day" | "long" | "daily"
    width: float  # bucket width of the scale
    idx: list[int]  # bucket indices
    ys: list[float]  # lower envelope, daily profile removed
    offset: float  # the profile at the last point (add back to get the metric's units)
    seasonal: bool  # a non-flat daily profile was removed
    profile_known: bool
    floor: float  # smallest level shift removed as a step
    _rising: bool | None = None
    _raw_rise: float | None = None
    _steps: Steps | None = None
    _z: float | None = None
    _trend: Trend | None = None
    wave: float = 0.0  # the cycle scale: half the swing of the fitted daily sine (0 elsewhere)
    floors: list[float] | None = None  # the lower envelope before any profile was removed
    _make_trend: Callable[[], Trend] | None = None  # a scale's own trend, made on first use
    _levelling: Levelling | bool | None = False  # False: not computed yet
    basis: list[list[float]] | None = None  # the cycle scale: its sine and cosine, fitted with a curve too
    sine: tuple[float, float] = (0.0, 0.0)  # the cycle scale: the coefficients of that sine and cosine

    def wave_ahead(self, seconds: float, season: float) -> float:
        """The cycle scale's fitted daily wave `seconds` after its last bucket, less its value there."""
        omega = 2 * math.pi * self.width / season
        ahead = omega * (self.idx[-1] + seconds / self.width)
        return self.sine[0] * math.sin(ahead) + self.sine[1] * math.cos(ahead) - self.offset

    @property
    def curve(self) -> Levelling | None:
        """The rising concave curve the step-free floor follows best (a cache filling to its TTL,
        a warm-up, fragmentation like log(t)), compared with a line. The daily scale's
        day-over-day differences have no curve of their own: its deceleration tells."""
        if self._levelling is False:
            self._levelling = self._curve(len(self.idx))
        return self._levelling  # type: ignore[return-value]

    def _curve(self, n: int) -> Levelling | None:
        """`curve` over the first `n` buckets of the fit."""
        if self.scale == "daily":
            return None
        if self.basis is not None and self.floors is not None:  # the daily wave fitted with it
            return levelling(self.xs[:n], self.floors[:n], [col[:n] for col in self.basis])
        return levelling(self.xs[:n], self.steps.clean[:n])

    @property
    def levelling(self) -> Levelling | None:
        """The curve, when it shows the growth levelling off (None: steady growth, or cannot tell)."""
        curve = self.curve
        return curve if curve is not None and curve.levelled else None

    @property
    def saturation_ruled_out(self) -> bool:
        """Enough buckets to tell a curve from a line, and no levelling curve fits better than the
        line: what a critical severity (one that remediation acts on) needs."""
        if self.scale == "daily":
            return True
        n = len(self.idx)
        if n < MIN_POINTS:
            return False
        # the newest bucket alone (a burst that filled it) must not hide the bend of the others;
        # on the cycle scale a sine bends to fit a cache filling up: the floor's own curve counts too
        curves = [self.curve, self._curve(n - 1)]
        if self.basis is not None and self.floors is not None:
            curves.append(levelling(self.xs, self.floors))
        return not any(c is not None and c.possible for c in curves)

    def reach(self, room: float, within: float) -> float:
        """`reach_margin` of the step-free floor (on the cycle scale, with the daily sine fitted
        beside each curve): how firmly every curve that rises less than `room` over `within` is
        rejected. The daily scale's differences have no curve: they always reach."""
        if self.scale == "daily":
            return math.inf
        if self.basis is not None and self.floors is not None:
            return reach_margin(self.xs, self.floors, room, within, self.basis)
        return reach_margin(self.xs, self.steps.clean, room, within)

    @property
    def rising(self) -> bool:
        """Whether the window has visibly risen once steps are removed (else it is not growing)."""
        if self._rising is None:
            self._raw_rise = thirds_rise(self.ys)
            self._rising = might_rise(self.ys, self.floor, self._raw_rise) and self.steps.risen
        return self._rising

    @property
    def steps(self) -> Steps:
        if self._steps is None:
            self._steps = remove_steps(self.ys, self.floor, self._raw_rise)
        return self._steps

    @property
    def confidence(self) -> float:
        """One-sided Mann-Kendall confidence that the step-free window grows (0 if not risen)."""
        if not self.rising:
            return 0.0
        if self._z is None:
            self._z = mann_kendall(self.steps.clean)[1]
        return normal_cdf(self._z)

    @property
    def xs(self) -> list[float]:
        width, half = self.width, 0.5 * self.width
        return [b * width + half for b in self.idx]

    @property
    def trend(self) -> Trend:
        if self._trend is None:
            if self._make_trend is not None:
                self._trend = self._make_trend()
                return self._trend
            self.confidence  # noqa: B018 - computes z
            self._trend = trend(self.xs, self.ys, self.steps, self._z or 0.0)
        return self._trend

    @property
    def level(self) -> float:
        """Lower-envelope level at the end of the fit, in the metric's units."""
        return self.trend.level + self.offset

    @property
    def coverage(self) -> float:
        """Seconds of history the fit stands on."""
        return (self.idx[-1] - self.idx[0] + 1) * self.width

    def long_enough(self, params: DetectParams, ttoom: float | None) -> bool:
        """Whether the fit may project `ttoom`: at most `max_extrapolation` times its coverage
        (with no limit known, it must cover its scale's whole window)."""
        if ttoom is None:
            needed = params.window if self.scale == "window" else params.long_window
        else:
            needed = ttoom / params.max_extrapolation
        return self.coverage >= needed - 1e-6

    @property
    def pct_per_hour(self) -> float:
        level = self.level
        return self.trend.slope * 3600 / level * 100 if level > 0 else 0.0

    def evidence(self) -> dict[str, Any]:
        t = self.trend
        return {
            "series": self.metric,
            "scale": self.scale,
            "slope_bytes_per_second": t.slope,
            "pct_per_hour": self.pct_per_hour,
            "recent_slope_bytes_per_second": t.recent_slope,
            "confidence": round(t.confidence, 6),
            "z": round(t.z, 3),
            "points": t.n,
            "span_seconds": self.coverage,
            "level_bytes": self.level,
            "noise_bytes": t.noise,
            "steps_removed": t.steps,
            "seasonal_adjusted": self.seasonal,
        }
