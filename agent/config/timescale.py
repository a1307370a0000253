"""The durations medic judges and waits by, on the agent's time scale (`agent.time_scale`).

    agent: {interval: 1s, time_scale: 180}      # a day of production passes in 8 minutes

`time_axis(config)` is the one place they are derived: the memory and slow detectors' parameters,
each instance's SLO window (through `TimeAxis.scale`, in the detection job) and the `remediation:`
section, each record applying `agent.core.timescale.TimeScale.span` to its own durations.
`problems(config)` is why a config cannot judge (a window or a stale limit shorter than the
interval its samples arrive at), each with its fix; the loader (`validate_config`) refuses those. `scaled(config)`
lists every duration the scale changed, and `notes(config)` the ones it held at a floor and the
real-time schedules slower than the compressed grid they serve, for `medic config check` and the
agent's start.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent.config.detect import history_problems
from agent.core.timescale import STALE_SAMPLES, WINDOW_SAMPLES, TimeScale
from agent.core.units import format_fine_duration
from agent.detect.params import DetectParams
from agent.detect.slow.detector import SlowParams, slo_from_settings
from remediation.config import RemediationSection

if TYPE_CHECKING:
    from agent.config.model import Config


@dataclass(frozen=True, slots=True)
class TimeAxis:
    scale: TimeScale
    memory: DetectParams
    slow: SlowParams
    remediation: RemediationSection


def time_axis(config: Config) -> TimeAxis:
    scale = TimeScale(config.agent.time_scale, config.agent.interval)
    return TimeAxis(
        scale,
        config.detect.memory_params().scaled(scale),
        config.detect.slow_params().scaled(scale),
        config.remediation.scaled(scale),
    )


@dataclass(frozen=True, slots=True)
class Scaled:
    """One duration as written (production's) and as medic uses it."""

    key: str
    written: float
    used: float

    def held(self, factor: float) -> bool:
        """Compression stopped at a floor."""
        return self.used > self.written / factor * (1 + 1e-9)


def scaled(config: Config) -> list[Scaled]:
    """Every duration the time scale changed, key by key."""
    axis = time_axis(config)
    found = list(_changed("detect.memory", config.detect.memory_params().to_dict(), axis.memory.to_dict()))
    found += _changed("detect.slow", config.detect.slow_params().to_dict(), axis.slow.to_dict())
    for index, spec in enumerate(config.instances):
        settings = {"latency": spec.latency.model_dump(by_alias=True)} if spec.latency else None
        written, used = slo_from_settings(settings), slo_from_settings(settings, axis.scale)
        if written is not None and used is not None and used.window != written.window:
            found.append(Scaled(f"instances[{index}].latency.slo.for", written.window, used.window))
    found += _changed(
        "remediation", _flat(config.remediation.model_dump()), _flat(axis.remediation.model_dump())
    )
    hour = axis.remediation.limits().hour
    if config.remediation.budget.max_per_hour is not None and hour != config.remediation.limits().hour:
        found.append(
            Scaled("remediation.budget.max_per_hour (its hour)", config.remediation.limits().hour, hour)
        )
    return found


def notes(config: Config) -> list[str]:
    """Where compression stopped short of `agent.time_scale`, and why (empty at time_scale 1)."""
    axis = time_axis(config)
    factor, interval = axis.scale.factor, axis.scale.interval
    if not axis.scale.compressed:
        return []
    found = []
    memory = config.detect.memory_params().window / axis.memory.window
    if memory < factor * (1 - 1e-9):
        found.append(
            f"detect.memory is compressed {memory:.4g}x, not {factor:g}x: its buckets (window / 24) would be "
            f"shorter than agent.interval ({format_fine_duration(interval)}) and its windows shrink together; "
            f"lower agent.interval to {format_fine_duration(config.detect.memory_params().bucket / factor)} "
            f"for {factor:g}x"
        )
    for item in scaled(config):
        if not item.key.startswith("detect.memory") and item.held(factor):
            floor = (
                "verify.stable_for, the least a restart takes"
                if item.key == "remediation.plan.restart_duration"
                else f"{item.used / interval:.3g} probe intervals of {format_fine_duration(interval)}: the samples it judges"
            )
            found.append(
                f"{item.key}: {format_fine_duration(item.written)} / {factor:g} would be "
                f"{format_fine_duration(item.written / factor)}, held at {format_fine_duration(item.used)} ({floor})"
            )
    return found + _slow_schedules(config, axis)


def _slow_schedules(config: Config, axis: TimeAxis) -> list[str]:
    """Schedules run in real time: one longer than the compressed grid it serves makes the agent judge
    or act only every so often."""
    found = []
    grid = min(axis.memory.step, axis.slow.step)
    if config.detect.interval > grid * (1 + 1e-9):
        found.append(
            f"detect.interval ({format_fine_duration(config.detect.interval)}) is longer than the compressed "
            f"judgement step ({format_fine_duration(grid)}): the detectors judge only that often; set it to "
            f"{format_fine_duration(grid)} or less"
        )
    margin, every = axis.remediation.plan.safety_margin, config.remediation.interval
    if config.remediation.mode != "off" and every > margin / 4 * (1 + 1e-9):
        found.append(
            f"remediation.interval ({format_fine_duration(every)}) is more than a quarter of the compressed "
            f"plan.safety_margin ({format_fine_duration(margin)}): a restart may start up to "
            f"{format_fine_duration(every)} after its slot; set it to {format_fine_duration(margin / 4)} or less"
        )
    return found


def problems(config: Config) -> list[str]:
    """Why this config cannot judge, each with its fix (empty: it can). Compressed windows are held
    at their floors, so these are windows written shorter than the samples they need."""
    axis = time_axis(config)
    interval, slow = config.agent.interval, axis.slow
    found = history_problems(axis.memory, config.agent.raw_retention, interval)
    windows = [
        (
            "detect.slow.stale",
            slow.stale,
            STALE_SAMPLES,
            "every value is read as missing before the next one",
        ),
        ("detect.slow.peer_window", slow.peer_window, WINDOW_SAMPLES, "it holds no sample to compare"),
    ]
    if slow.open_after * slow.step < interval * (1 - 1e-9):
        found.append(
            f"detect.slow: open_after x step ({slow.open_after} x {format_fine_duration(slow.step)}) is shorter "
            f"than agent.interval ({format_fine_duration(interval)}), so one sample opens a finding; set "
            f"detect.slow.step to at least {format_fine_duration(interval)} or lower agent.interval"
        )
    for index, spec in enumerate(config.instances):
        latency = spec.latency
        if latency is None:
            continue
        if latency.slo is not None:
            slo = slo_from_settings({"latency": latency.model_dump(by_alias=True)}, axis.scale)
            assert slo is not None
            windows.append(
                (
                    f"instances[{index}].latency.slo.for",
                    slo.window,
                    WINDOW_SAMPLES,
                    "it holds no sample to judge",
                )
            )
        if latency.canary is not None and latency.prometheus is None:
            every = max(latency.canary.interval, interval)
            if every > slow.stale * (1 + 1e-9):
                found.append(
                    f"instances[{index}].latency.canary.interval ({format_fine_duration(every)}) is longer than "
                    f"detect.slow.stale ({format_fine_duration(slow.stale)}{_on_axis(axis.scale)}): its latency is "
                    f"read as missing between two requests and never judged; set canary.interval to at most "
                    f"{format_fine_duration(slow.stale)}"
                )
    for key, value, samples, why in windows:
        if value < interval * (1 - 1e-9):
            found.append(
                f"{key} ({format_fine_duration(value)}{_on_axis(axis.scale)}) is shorter than agent.interval "
                f"({format_fine_duration(interval)}): {why}; set it to at least "
                f"{format_fine_duration(samples * interval)} ({samples} probe intervals) or lower agent.interval to "
                f"{format_fine_duration(value / samples)}"
            )
    return found


def _on_axis(scale: TimeScale) -> str:
    return f" on agent.time_scale {scale.factor:g}" if scale.compressed else ""


def _changed(prefix: str, written: Mapping[str, Any], used: Mapping[str, Any]) -> Iterator[Scaled]:
    for key, value in written.items():
        other = used.get(key)
        if isinstance(value, float) and isinstance(other, float) and other != value:
            yield Scaled(f"{prefix}.{key}", value, other)


def _flat(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"budget": {"cooldown": 3600.0}}` as `{"budget.cooldown": 3600.0}`."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
