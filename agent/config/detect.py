"""The `detect:` section: how often the detection job runs, and the detectors' tunables.

    detect:
      interval: 15s
      memory: {window: 6h, long_window: 48h, horizon: 24h, warmup: 30m}   # leak, oom-risk, fragmentation
      slow: {peer_window: 5m, trend_window: 30m}                          # latency

`memory` has the keys of `agent.detect.params.DetectParams`, `slow` those of
`agent.detect.slow.rules.SlowParams` (docs/detection.md and docs/latency.md explain them): each
section is built from its parameters' fields, whose `Setting` (`agent.detect.params.setting`) gives a
key's default, kind and bounds, so a tunable is declared once and the config cannot drift from the
detector. Each key is typed and bounded, so a bad value is refused on load in one line that names it
(`detect.memory.window: ...`); the rules that relate two keys (`long_window` at least `window`) are the
parameters' own and are reported on the section (`detect.memory: ...`).

Durations are production's: `agent.time_scale` compresses them, with the remediation's, in one place
(`agent.config.timescale`). `history_problems` says when the store would not keep the history the
memory detectors need at the resolution they read it at; the config refuses such a pair with the fix.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Annotated, Any, get_type_hints

from pydantic import BeforeValidator, Field, create_model, model_validator

from agent.core.types import MAX_COUNT, MAX_DURATION, Duration, Interval, PositiveDuration, Size, Strict
from agent.core.units import format_duration, format_fine_duration
from agent.detect.params import SETTING, DetectParams, Kind, Setting
from agent.detect.slow.rules import SlowParams

ROLLUP_SECONDS = 60.0  # the store's rollup resolution (agent.state.series): finer buckets need raw samples


def _not_bool(value: Any) -> Any:
    """`true` is not a number here, although Python (and pydantic) would read it as 1."""
    if isinstance(value, bool):
        raise ValueError(f"expected a number, got {value!r}")
    return value


Whole = Annotated[int, BeforeValidator(_not_bool)]  # `3`, `3.0`, `"3"`; never `3.5`, `true` or `.inf`
Number = Annotated[float, BeforeValidator(_not_bool), Field(allow_inf_nan=False)]
Figure = Annotated[Number, Field(ge=0, le=MAX_DURATION)]  # a ratio, rate or score: bounded like a duration
KINDS: dict[Kind, Any] = {
    "duration": Duration,
    "span": PositiveDuration,
    "count": Whole,
    "number": Number,
    "figure": Figure,
    "size": Size,
}


def _key(param: dataclasses.Field[Any], default: Any) -> tuple[Any, Any]:
    """The config key of one tunable: its kind's type, its default and bounds (`Setting`)."""
    setting: Setting = param.metadata[SETTING]  # a tunable without one is an error on import
    bounds = {name: getattr(setting, name) for name in ("ge", "gt", "le", "lt")}
    if setting.kind == "count" and bounds["le"] is None:
        bounds["le"] = MAX_COUNT
    default = int(default) if setting.kind == "size" else default
    return KINDS[setting.kind], Field(default, **{k: v for k, v in bounds.items() if v is not None})


def _keys(params: type[Any]) -> dict[str, Any]:
    """A section's keys: one per field of its parameters, in their order, with their defaults."""
    defaults = params()
    return {param.name: _key(param, getattr(defaults, param.name)) for param in dataclasses.fields(params)}


def _values(section: Strict, params: type[Any]) -> dict[str, Any]:
    """The section's values as its parameters' fields take them (a size's bytes as a float)."""
    types = get_type_hints(params)
    return {name: types[name](value) for name, value in section.model_dump().items()}


class MemoryRules(Strict):
    """`detect.memory`: the leak, oom-risk and fragmentation detectors (`DetectParams`, whose fields
    `MemoryDetection` adds as its keys)."""

    @model_validator(mode="before")
    @classmethod
    def _empty_keys_keep_defaults(cls, data: Any) -> Any:
        """`window:` with no value keeps the default, as it always has."""
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> MemoryRules:
        memory_params(self)  # the rules across keys, such as long_window >= window
        return self


class SlowRules(Strict):
    """`detect.slow`: the latency detector (`SlowParams`, whose fields `SlowDetection` adds as its keys)."""

    @model_validator(mode="after")
    def _consistent(self) -> SlowRules:
        slow_params(self)
        return self


if TYPE_CHECKING:  # the keys are added on import, from the parameters' fields
    MemoryDetection = MemoryRules
    SlowDetection = SlowRules
else:
    MemoryDetection = create_model(
        "MemoryDetection",
        __base__=MemoryRules,
        __module__=__name__,
        __doc__=MemoryRules.__doc__,
        **_keys(DetectParams),
    )
    SlowDetection = create_model(
        "SlowDetection",
        __base__=SlowRules,
        __module__=__name__,
        __doc__=SlowRules.__doc__,
        **_keys(SlowParams),
    )


def memory_params(section: MemoryRules) -> DetectParams:
    """The memory detectors' parameters; `ValueError` for values that do not fit together."""
    return DetectParams(**_values(section, DetectParams))


def slow_params(section: SlowRules) -> SlowParams:
    """The latency detector's parameters; `ValueError` for values that do not fit together."""
    return SlowParams(**_values(section, SlowParams))


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
