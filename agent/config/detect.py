"""The `detect:` section: how often the detection job runs, and the detectors' tunables.

    detect:
      interval: 15s
      memory: {window: 6h, long_window: 48h, horizon: 24h, warmup: 30m}   # leak, oom-risk, fragmentation
      slow: {peer_window: 5m, trend_window: 30m}                          # latency

`memory` has the keys of `agent.detect.params.DetectParams`, `slow` those of
`agent.detect.latency_rules.SlowParams`, with the same defaults (docs/detection.md and docs/latency.md
explain them). Each key is typed and bounded here, so a bad value is refused on load in one line that
names it (`detect.memory.window: ...`); the rules that relate two keys (`long_window` at least
`window`) are the parameters' own and are reported on the section (`detect.memory: ...`).

Durations are production's: `agent.time_scale` compresses them, with the remediation's, in one place
(`agent.config.timescale`). `history_problems` says when the store would not keep the history the
memory detectors need at the resolution they read it at; the config refuses such a pair with the fix.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, model_validator

from agent.core.types import MAX_COUNT, MAX_DURATION, Duration, Interval, PositiveDuration, Size, Strict
from agent.core.units import format_duration, format_fine_duration
from agent.detect.latency_rules import SlowParams
from agent.detect.params import MAX_COUNT as MEMORY_MAX_COUNT
from agent.detect.params import DetectParams

ROLLUP_SECONDS = 60.0  # the store's rollup resolution (agent.state.series): finer buckets need raw samples


def _not_bool(value: Any) -> Any:
    """`true` is not a number here, although Python (and pydantic) would read it as 1."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    return value


Whole = Annotated[int, BeforeValidator(_not_bool)]  # `3`, `3.0`, `"3"`; never `3.5`, `true` or `.inf`
Number = Annotated[float, BeforeValidator(_not_bool), Field(allow_inf_nan=False)]
Figure = Annotated[Number, Field(ge=0, le=MAX_DURATION)]  # a ratio, rate or score: bounded like a duration

_MEMORY = DetectParams()
_SLOW = SlowParams()


class MemoryDetection(Strict):
    """`detect.memory`: the leak, oom-risk and fragmentation detectors (`DetectParams`)."""

    window: PositiveDuration = _MEMORY.window
    long_window: PositiveDuration = _MEMORY.long_window
    horizon: PositiveDuration = _MEMORY.horizon
    warmup: Duration = _MEMORY.warmup
    min_buckets: Whole = Field(_MEMORY.min_buckets, ge=4, le=MEMORY_MAX_COUNT)
    confidence: Number = Field(_MEMORY.confidence, gt=0.5, lt=1)
    confidence_clear: Number = Field(_MEMORY.confidence_clear, gt=0, lt=1)
    decel_ratio: Number = _MEMORY.decel_ratio
    min_rate: Number = _MEMORY.min_rate
    open_after: Whole = Field(_MEMORY.open_after, ge=1, le=MEMORY_MAX_COUNT)
    resolve_after: Whole = Field(_MEMORY.resolve_after, ge=1, le=MEMORY_MAX_COUNT)
    frag_ratio: Number = Field(_MEMORY.frag_ratio, gt=1)
    frag_ratio_jvm: Number = Field(_MEMORY.frag_ratio_jvm, gt=1)
    frag_min_bytes: Size = int(_MEMORY.frag_min_bytes)
    max_extrapolation: Number = Field(_MEMORY.max_extrapolation, ge=1, le=MEMORY_MAX_COUNT)
    season: PositiveDuration = _MEMORY.season
    season_days: Whole = Field(_MEMORY.season_days, ge=3, le=MEMORY_MAX_COUNT)
    gap: PositiveDuration = _MEMORY.gap
    reset_drop: Number = Field(_MEMORY.reset_drop, gt=0, lt=1)

    @model_validator(mode="before")
    @classmethod
    def _empty_keys_keep_defaults(cls, data: Any) -> Any:
        """`window:` with no value keeps the default, as it always has."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> MemoryDetection:
        memory_params(self)  # the rules across keys, such as long_window >= window
        return self


class SlowDetection(Strict):
    """`detect.slow`: the latency detector (`SlowParams`)."""

    step: PositiveDuration = _SLOW.step
    stale: PositiveDuration = _SLOW.stale
    min_coverage: Figure = _SLOW.min_coverage
    fire_fraction: Figure = _SLOW.fire_fraction
    clear_margin: Figure = _SLOW.clear_margin
    clear_fraction: Figure = _SLOW.clear_fraction
    peer_window: PositiveDuration = _SLOW.peer_window
    peer_min: Whole = Field(_SLOW.peer_min, ge=1, le=MAX_COUNT)
    peer_z: Figure = _SLOW.peer_z
    peer_ratio: Figure = _SLOW.peer_ratio
    peer_floor: Duration = _SLOW.peer_floor
    peer_z_clear: Figure = _SLOW.peer_z_clear
    peer_ratio_clear: Figure = _SLOW.peer_ratio_clear
    peer_min_scale: Figure = _SLOW.peer_min_scale
    trend_window: PositiveDuration = _SLOW.trend_window
    trend_buckets: Whole = Field(_SLOW.trend_buckets, ge=6, le=MAX_COUNT)
    trend_confidence: Figure = _SLOW.trend_confidence
    trend_confidence_clear: Figure = _SLOW.trend_confidence_clear
    trend_min_growth: Figure = _SLOW.trend_min_growth
    trend_decel: Figure = _SLOW.trend_decel
    horizon: Duration = _SLOW.horizon
    throttle_ratio: Figure = _SLOW.throttle_ratio
    pressure_ratio: Figure = _SLOW.pressure_ratio
    near_limit: Figure = _SLOW.near_limit
    major_faults_rate: Figure = _SLOW.major_faults_rate
    open_after: Whole = Field(_SLOW.open_after, ge=1, le=MAX_COUNT)
    resolve_after: Whole = Field(_SLOW.resolve_after, ge=1, le=MAX_COUNT)

    @model_validator(mode="after")
    def _consistent(self) -> SlowDetection:
        slow_params(self)
        return self


def memory_params(section: MemoryDetection) -> DetectParams:
    """The memory detectors' parameters; `ValueError` for values that do not fit together."""
    values = section.model_dump()
    values["frag_min_bytes"] = float(section.frag_min_bytes)
    return DetectParams(**values)


def slow_params(section: SlowDetection) -> SlowParams:
    """The latency detector's parameters; `ValueError` for values that do not fit together."""
    return SlowParams(**section.model_dump())


MOVED_TIME_SCALE = (
    "detect.time_scale is now agent.time_scale: it compresses every duration medic judges or waits by, "
    "remediation's included; write `agent: {time_scale: N}` instead"
)


class DetectSection(Strict):
    """`detect`: the detection job's schedule and each detector's tunables, turned into its parameters
    (as written: `agent.config.timescale` puts them on the agent's time scale)."""

    interval: Interval = 15.0  # how often the job looks for a judgement instant it has not judged
    workload_label: Annotated[str, Field(min_length=1, max_length=63)] = "fleet"  # instances sharing priors
    memory: MemoryDetection = Field(default_factory=MemoryDetection)
    slow: SlowDetection = Field(default_factory=SlowDetection)

    @model_validator(mode="before")
    @classmethod
    def _time_scale_moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "time_scale" in data:
            raise ValueError(MOVED_TIME_SCALE)
        return data

    def memory_params(self) -> DetectParams:
        return memory_params(self.memory)

    def slow_params(self) -> SlowParams:
        return slow_params(self.slow)


def history_problems(params: DetectParams, raw_retention: float, sample_interval: float) -> list[str]:
    """Why the store could not feed the memory detectors `params`, each with its fix (empty: it can).

    The detection job reads each bucket's minimum and maximum; buckets under a minute need raw samples,
    so the whole history then has to be within `agent.raw_retention` (older ranges come back as 1-minute
    rollups, which leave such buckets mostly empty and the detectors blind). Buckets shorter than the
    sampling interval are empty too.
    """
    problems = []
    bucket, history = params.bucket, params.history
    if bucket < ROLLUP_SECONDS and history > raw_retention:
        problems.append(
            f"detect.memory needs {format_duration(history)} of history (the longer of long_window and "
            f"(season_days + 1) x season) at {format_duration(bucket)} buckets, but agent.raw_retention keeps "
            f"raw samples for {format_duration(raw_retention)}; set agent.raw_retention to at least "
            f"{_rounded_up(history)}, or compress every duration at once with agent.time_scale "
            "instead of setting the windows alone (season and long_window shrink with it)"
        )
    if bucket < sample_interval * (1 - 1e-9):
        problems.append(
            f"detect.memory buckets (window / 24 = {format_fine_duration(bucket)}) are shorter than agent.interval "
            f"({format_fine_duration(sample_interval)}), so most of them hold no sample; lower agent.interval to "
            f"{format_fine_duration(bucket)} or less, or lengthen detect.memory.window"
        )
    return problems


def _rounded_up(seconds: float) -> str:
    """A duration at least `seconds`, written in the two units `format_duration` shows."""
    unit = 3600 if seconds >= 86400 else 60 if seconds >= 3600 else 1
    return format_duration(math.ceil(seconds / unit) * unit)
