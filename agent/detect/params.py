"""Tunables of the detectors, with defaults for production and a way to compress time.

All durations are seconds. The judgement runs on a grid of `bucket` seconds aligned to the
epoch, so the online path (any schedule) and `medic analyze` (a replay) judge the same data
at the same instants.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, TypeVar

from agent.core.timescale import TimeScale

DAY = 86400.0
MAX_SPAN = 365 * DAY  # a longer window or horizon is a typo (and overflows the grid arithmetic)
MAX_COUNT = 10_000

SETTING = "setting"  # the metadata key of a tunable's `Setting`
Kind = Literal["duration", "span", "count", "number", "figure", "size"]
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Setting:
    """How a tunable is written in the `detect:` config section, which `agent.config.detect` builds
    from these fields, so each key's name, default and bounds are declared once, here. The kind says
    what a value may be written as: a `duration` (`6h`, at least 0) or a `span` (a duration above 0),
    a whole `count` (at most the config's `MAX_COUNT` unless `le` says less), a finite `number`, a
    `figure` (a ratio, rate or score: a number from 0 bounded like a duration) or a `size` (`128Mi`);
    the bounds narrow it."""

    kind: Kind
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None


def setting(
    default: T,
    kind: Kind,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> T:
    """A tunable with its default and how the config writes and bounds it (`Setting`)."""
    return field(default=default, metadata={SETTING: Setting(kind, ge=ge, gt=gt, le=le, lt=lt)})


@dataclass(frozen=True, slots=True)
class DetectParams:
    window: float = setting(6 * 3600.0, "span")
    """Span of the main trend fit; the lower envelope is taken in buckets of `window / 24`."""
    long_window: float = setting(48 * 3600.0, "span")
    """Span of the slow-leak fit, in buckets of `long_window / 24` (a whole number of main buckets)."""
    horizon: float = setting(24 * 3600.0, "span")
    """`oom-risk` fires when the projected time to the memory limit is shorter than this."""
    warmup: float = setting(30 * 60.0, "duration")
    """Growth in the first `warmup` of each process lifetime is not judged as a leak."""
    min_buckets: int = setting(6, "count", ge=4, le=MAX_COUNT)
    """Fewest lower-envelope buckets a fit needs (6 × 15 min = 1.5 h at the defaults)."""
    confidence: float = setting(0.999, "number", gt=0.5, lt=1)
    """Trend confidence (one-sided Mann-Kendall) needed to fire."""
    confidence_clear: float = setting(0.9, "number", gt=0, lt=1)
    """Below this the trend is clearly gone; between the two, findings hold."""
    decel_ratio: float = setting(0.5, "number")
    """Growth whose recent slope is below this fraction of its earlier slope is plateauing."""
    min_rate: float = setting(0.02, "number")
    """Growth slower than this (% of the level per hour) is never a leak."""
    open_after: int = setting(2, "count", ge=1, le=MAX_COUNT)
    """Consecutive firing judgements (one every `step`) before a finding opens."""
    resolve_after: int = setting(4, "count", ge=1, le=MAX_COUNT)
    """Consecutive clear judgements before an open finding resolves."""
    frag_ratio: float = setting(1.5, "number", gt=1)
    """Resident / live bytes above this is fragmentation (allocator statistics)."""
    frag_ratio_jvm: float = setting(3.0, "number", gt=1)
    """RSS / heap-after-GC above this is a JVM holding heap it does not use."""
    frag_min_bytes: float = setting(128 * 2**20, "size")
    """Resident minus live bytes must exceed this for a fragmentation finding."""
    max_extrapolation: float = setting(7.0, "number", ge=1, le=MAX_COUNT)
    """A fit may project at most this many times its own span: a leak needs at least
    `min(window, time_to_oom / max_extrapolation)` of steady growth."""
    season: float = setting(DAY, "span")
    """Period of the traffic cycle the profile learns (a day; tests compress it)."""
    season_days: int = setting(7, "count", ge=3, le=MAX_COUNT)
    """Periods of history used to learn the profile (at least 3 are needed)."""
    gap: float = setting(30 * 60.0, "span")
    """Offline only: a gap in the samples longer than this starts a new process lifetime."""
    reset_drop: float = setting(0.5, "number", gt=0, lt=1)
    """Offline only: memory falling below this fraction of its lower envelope is a restart."""

    def __post_init__(self) -> None:
        problems = []
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                problems.append(f"{f.name} must be a finite number")
        if problems:
            raise ValueError("invalid detection parameters: " + "; ".join(problems))
        for name in sorted(_DURATIONS):
            if getattr(self, name) > MAX_SPAN:
                problems.append(f"{name} must be at most 365d")
        for name in ("min_buckets", "open_after", "resolve_after", "season_days"):
            if getattr(self, name) > MAX_COUNT:
                problems.append(f"{name} must be at most {MAX_COUNT}")
        if self.max_extrapolation > MAX_COUNT or self.frag_min_bytes > 2**50:
            problems.append(
                f"max_extrapolation must be at most {MAX_COUNT} and frag_min_bytes at most 1024Ti"
            )
        for name in ("window", "long_window", "horizon"):
            if not getattr(self, name) > 0:
                problems.append(f"{name} must be positive")
        if self.long_window < self.window:
            problems.append("long_window must be at least window")
        if self.warmup < 0 or self.gap <= 0:
            problems.append("warmup must be >= 0 and gap > 0")
        if self.max_extrapolation < 1 or self.season <= 0 or self.season_days < 3:
            problems.append("max_extrapolation must be >= 1, season > 0 and season_days >= 3")
        if self.min_buckets < 4:
            problems.append("min_buckets must be at least 4")
        if not 0.5 < self.confidence < 1 or not 0 < self.confidence_clear < self.confidence:
            problems.append("need 0 < confidence_clear < confidence < 1")
        if self.open_after < 1 or self.resolve_after < 1:
            problems.append("open_after and resolve_after must be at least 1")
        if self.frag_ratio <= 1 or self.frag_ratio_jvm <= 1:
            problems.append("fragmentation ratios must be above 1")
        if not 0 < self.reset_drop < 1:
            problems.append("reset_drop must be between 0 and 1")
        if problems:
            raise ValueError("invalid detection parameters: " + "; ".join(problems))

    @property
    def bucket(self) -> float:
        """Width of a lower-envelope bucket and of the judgement grid."""
        return self.window / 24

    @property
    def step(self) -> float:
        """Time between two judgements (four buckets, an hour at the defaults): leaks unfold over
        hours and days, so judging hourly loses little and keeps a replay of a fleet fast."""
        return 4 * self.bucket

    @property
    def long_factor(self) -> int:
        """How many main buckets make one long-window bucket."""
        return max(1, round(self.long_window / 24 / self.bucket))

    @property
    def long_bucket(self) -> float:
        return self.bucket * self.long_factor

    @property
    def history(self) -> float:
        """How much history `evaluate` needs to give the same answer as a full replay."""
        return max(self.long_window, (self.season_days + 1) * self.season) + self.bucket

    def scaled(self, scale: TimeScale | float) -> DetectParams:
        """The same detector on a shorter time axis (`agent.core.timescale`). Its durations are tied
        to one another (a season is a whole number of steps, a long bucket of buckets), so all of
        them shrink alike: by less than the scale when a bucket would be shorter than a probe interval."""
        axis = TimeScale.of(scale)
        axis = axis.capped(self.bucket, axis.samples(1))
        spans = {name: axis.span(getattr(self, name)) for name in sorted(_DURATIONS)}
        # every name in _DURATIONS is a float field; mypy matches ** against the int fields too
        return replace(self, **spans)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_DURATIONS = {"window", "long_window", "horizon", "warmup", "gap", "season"}
