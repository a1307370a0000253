"""Value types shared by every config model (agent, remediation, notify): durations, sizes, bounds,
the `Strict` base of every config section, and the `Severity` and `Kind` vocabularies.

Every duration is at most `MAX_DURATION` and every size at most `MAX_SIZE`: a longer value is a typo,
and would overflow a timer (`Event.wait(1e13)` raises in the thread that waits). Keys that need
tighter bounds say so with `within(low, high)`:

    timeout: Annotated[Duration, within(0, HOUR, above=True)] = 30.0   # more than 0s, at most 1h
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict

from agent.core.units import parse_duration, parse_size

MINUTE = 60.0
HOUR = 3600.0
DAY = 86400.0
MAX_DURATION = 365 * DAY
MAX_SIZE = 2**50  # 1024Ti, beyond any memory limit or file medic reads
MAX_COUNT = 1_000_000  # the loosest bound for a count: limits, retries, items kept

Severity = Literal["info", "warning", "error", "critical"]
# What a finding is about: the memory detectors' three, the latency detector's, and an alert from outside
Kind = Literal["leak", "oom-risk", "fragmentation", "slow", "external", "crash-loop"]


class Strict(BaseModel):
    """A config section: unknown keys are errors (a typo must not pass silently), values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def human_duration(seconds: float) -> str:
    """`50ms`, `90s`, `5m`, `1h`, `365d`: a bound as a person writes it in the config."""
    if 0 < seconds < 1:
        return f"{seconds * 1000:g}ms"
    if seconds >= 120:
        for unit, size in (("d", DAY), ("h", HOUR), ("m", MINUTE)):
            if seconds % size == 0:
                return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def human_size(size: int) -> str:
    for unit, factor in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if size >= factor and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def _duration(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds > MAX_DURATION:
        raise ValueError(f"expected a duration of at most {human_duration(MAX_DURATION)}, got {value!r}")
    return seconds


def _size(value: Any) -> int:
    size = parse_size(value)
    if size > MAX_SIZE:
        raise ValueError(f"expected a size of at most {human_size(MAX_SIZE)}, got {value!r}")
    return size


Duration = Annotated[float, BeforeValidator(_duration)]  # `5s`, `10m`, `1h30m` → seconds
Size = Annotated[int, BeforeValidator(_size)]  # `512Mi`, `2G` → bytes


def within(low: float, high: float, *, above: bool = False, why: str = "") -> AfterValidator:
    """A duration between `low` and `high` (more than `low` when `above`), refused in one clear line."""
    first = f"above {human_duration(low)} and at most" if above else f"between {human_duration(low)} and"
    message = f"must be {first} {human_duration(high)}" + (f" ({why})" if why else "")

    def check(value: float) -> float:
        if value > high or value < low or (above and value == low):
            raise ValueError(message)
        return value

    return AfterValidator(check)


def size_within(low: int, high: int) -> AfterValidator:
    """A size between `low` and `high` bytes."""
    message = f"must be between {human_size(low)} and {human_size(high)}"

    def check(value: int) -> int:
        if not low <= value <= high:
            raise ValueError(message)
        return value

    return AfterValidator(check)


PositiveDuration = Annotated[Duration, within(0, MAX_DURATION, above=True)]
Timeout = Annotated[Duration, within(0, HOUR, above=True)]  # a wait on something else: at most 1h
Interval = Annotated[Duration, within(0.05, HOUR)]  # a schedule's period: 50ms to 1h
