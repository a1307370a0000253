"""Sustained growth of a short series (`Growth`): whether a suspect's bytes or count, or a memory layer,
grows confidently, well clear of its scatter, with a floor that rises block after block, and without
levelling off.

It is the leak detector's robust trend test (`agent.detect.trend`: level shifts removed, Theil-Sen
slope, Mann-Kendall confidence corrected for autocorrelation) with the checks a few snapshots need:
garbage counted by `GC.class_histogram -all` lands anywhere in its range at each snapshot, and a few
snapshots of it can fool a trend test, rarely all four checks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

from agent.detect.trend import mann_kendall, normal_cdf, remove_steps, theil_sen, trend

MIN_POINTS = 4  # the trend test needs at least four snapshots
MIN_CONFIDENCE = 0.95
MIN_SIGNAL = 4.0  # garbage that happens to rise over a few snapshots scatters widely around its line
MIN_ASCENT = 0.8  # ... and its floor does not rise block after block (see `ascent`)
CLEAR_SIGNAL = 20.0  # a rise this many times the scatter is judged without the autocorrelation discount
ASCENT_BLOCKS = 8
DECEL_RATIO = 0.25
STEP_FLOOR = 0.02  # as the leak detector: a level shift must exceed 2 % of the level to be removed


@dataclass(frozen=True, slots=True)
class Growth:
    slope: float
    confidence: float
    decel: float
    signal: float = 0.0  # rise over the window divided by the scatter around the fitted line
    ascent: float = 0.0  # share of rising steps between the minima of (up to 8) consecutive blocks

    @property
    def sustained(self) -> bool:
        """Confident, clear of the scatter, rising from block to block, and not levelling off."""
        return (
            self.slope > 0
            and self.confidence >= MIN_CONFIDENCE
            and self.signal >= MIN_SIGNAL
            and self.ascent >= MIN_ASCENT
            and self.decel >= DECEL_RATIO
        )


def ascent(ys: list[float], blocks: int = ASCENT_BLOCKS) -> float:
    """Share of steps up between the lower envelopes of consecutive blocks of `ys`.

    Garbage counted by `-all` histograms lands anywhere in its range at each snapshot, and a few random
    snapshots can line up well enough for a trend test; a leak keeps its floor rising block after block.
    Taking block minima keeps this true for a slow leak under noise over a long window.
    """
    n = len(ys)
    k = min(n, blocks)
    if k < 2:
        return 0.0
    bounds = [round(i * n / k) for i in range(k + 1)]
    floors = [min(ys[bounds[i] : bounds[i + 1]]) for i in range(k)]
    return sum(b > a for a, b in pairwise(floors)) / (k - 1)


def growth(xs: list[float], ys: list[float]) -> Growth:
    """Robust slope and one-sided confidence that `ys` grows (0 unless it visibly rose)."""
    if len(xs) < MIN_POINTS or max(ys) == min(ys):
        return Growth(0.0, 0.0, 0.0)
    steps = remove_steps(ys, STEP_FLOOR * abs(ys[-1]))
    if not steps.risen:
        return Growth(theil_sen(xs, steps.clean), 0.0, 0.0)
    z = mann_kendall(steps.clean)[1]
    fitted = trend(xs, ys, steps, z)
    rise = fitted.slope * (xs[-1] - xs[0])
    signal = rise / fitted.noise if fitted.noise > 0 else math.inf
    # the trend test discounts z for autocorrelated residuals (a drift wandering up for hours); on a
    # few snapshots of a near-perfect line the residuals are specks whose pattern says nothing
    confidence = normal_cdf(z) if signal >= CLEAR_SIGNAL else fitted.confidence
    return Growth(fitted.slope, confidence, fitted.decel, signal, ascent(steps.clean))
